"""Scoring a model on a whole split: NLL per token and bits per character.

Bits per character makes char and subword models comparable: the split's total
NLL (in bits) divided by the number of characters its scored tokens decode to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gru_experiments.data import IGNORE_INDEX, EvalBatches
from gru_experiments.ngram import NGramLM


@dataclass
class Score:
    nll_sum: float = 0.0  # nats, summed over scored tokens
    tokens: int = 0
    characters: int = 0

    def add(self, other: "Score") -> "Score":
        return Score(self.nll_sum + other.nll_sum, self.tokens + other.tokens, self.characters + other.characters)

    @property
    def nll(self) -> float:
        """Mean NLL per token, in nats."""
        return self.nll_sum / max(self.tokens, 1)

    @property
    def bpc(self) -> float:
        return self.nll_sum / math.log(2) / max(self.characters, 1)


def score_batch(logits: Tensor, targets: Tensor, token_char_lengths: Tensor) -> Score:
    """Summed NLL of logits (..., V) against targets (...), IGNORE_INDEX positions skipped."""
    nll_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                              ignore_index=IGNORE_INDEX, reduction="sum")
    scored = targets[targets != IGNORE_INDEX]
    return Score(nll_sum.item(), scored.numel(), int(token_char_lengths.to(scored.device)[scored].sum().item()))


@torch.no_grad()
def score_windows(model, ids: Tensor, seq_len: int, batch_size: int, token_char_lengths: Tensor) -> Score:
    """Every target of `ids` predicted from the previous tokens of its window, from a zero state."""
    was_training = model.training
    model.eval()
    total = Score()
    for inputs, targets in EvalBatches(ids, batch_size, seq_len):
        logits, _ = model(inputs)
        total = total.add(score_batch(logits, targets, token_char_lengths))
    model.train(was_training)
    return total


# --- The inference modes on a whole split ---------------------------------------------------
# Every function below scores the same targets, ids[1:], each exactly once, so their numbers
# compare directly (and with `score_windows`, the training-time validation loss).

@torch.no_grad()
def score_stateful(model, ids: Tensor, seq_len: int, streams: int, token_char_lengths: Tensor) -> Score:
    """Stateful: the split cut into `streams` contiguous streams run side by side, chunk by chunk
    (chunks of seq_len), the state carried across chunk boundaries. Only the first token of each
    stream is predicted from a zero state."""
    n_targets = ids.numel() - 1
    streams = max(1, min(streams, n_targets))
    length = -(-n_targets // streams)
    inputs = torch.zeros(streams * length, dtype=torch.long, device=ids.device)
    targets = torch.full((streams * length,), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    inputs[:n_targets], targets[:n_targets] = ids[:-1], ids[1:]  # padding only at the very end
    inputs, targets = inputs.view(streams, length), targets.view(streams, length)

    was_training = model.training
    model.eval()
    total, state = Score(), None
    for start in range(0, length, seq_len):
        logits, state = model(inputs[:, start:start + seq_len], state)
        total = total.add(score_batch(logits, targets[:, start:start + seq_len], token_char_lengths))
    model.train(was_training)
    return total


@torch.no_grad()
def stateless_log_probs(model) -> Tensor:
    """(V, V) table: row a holds log p(next token | a) from a zero state, i.e. everything a
    stateless model can ever predict. One forward pass over the whole vocabulary."""
    was_training = model.training
    model.eval()
    vocab = torch.arange(model.vocab_size, device=model.device).unsqueeze(1)
    logits, _ = model(vocab)
    model.train(was_training)
    return F.log_softmax(logits[:, 0].double(), dim=-1)  # a small table: float64 keeps count models exact


def score_table(log_probs: Tensor, ids: Tensor, token_char_lengths: Tensor) -> Score:
    """Every target of `ids` scored by a first-order table: log_probs[previous, target]."""
    previous, targets = ids[:-1], ids[1:]
    log_probs = log_probs.to(ids.device)
    nll_sum = -log_probs[previous, targets].double().sum().item()
    characters = int(token_char_lengths.to(ids.device)[targets].sum().item())
    return Score(nll_sum, targets.numel(), characters)


def score_stateless(model, ids: Tensor, token_char_lengths: Tensor) -> Score:
    """Stateless: every target predicted from its previous token alone, from a zero state
    (exact: the model's whole stateless behaviour is a V x V table)."""
    return score_table(stateless_log_probs(model), ids, token_char_lengths)


def score_bigram(train_ids: Tensor, ids: Tensor, token_char_lengths: Tensor) -> Score:
    """The baseline: the n-gram family at order 2, add-one smoothed, counted from the training
    split ((count(a, b) + 1) / (count(a) + V)), every target of `ids` from its previous token."""
    bigram = NGramLM(token_char_lengths.numel(), order=2, smoothing="add_one").to(ids.device).fit(train_ids)
    return score_stateless(bigram, ids, token_char_lengths)


@torch.no_grad()
def score_windowed(model, ids: Tensor, window: int, token_char_lengths: Tensor, stride: int = 1,
                   batch_tokens: int = 1 << 16) -> Score:
    """Windowed: every target predicted from the `window` tokens before it (fewer at the start of
    the split), run from a zero state. Unlike `score_windows`, each target gets its own window,
    so this costs `window` times a single pass.

    stride > 1 scores only every stride-th target (positions 1, 1 + stride, ...): a systematic
    sample, an estimate rather than the exact figure. Windows go through the model in batches of
    about `batch_tokens` tokens.
    """
    if window < 1 or stride < 1:
        raise ValueError(f"window and stride must be >= 1, got {window} and {stride}")
    if sees_whole_window(model, window):
        # Every window holds all the model can see: one pass over the split, the state carried,
        # predicts each target exactly as its own window would.
        return _score_in_one_pass(model, ids, stride, token_char_lengths)
    was_training = model.training
    model.eval()
    positions = torch.arange(1, ids.numel(), stride, device=ids.device)  # indices of scored targets
    total = Score()
    # Targets 1..window: their windows are prefixes of ids[:window], so one pass over that prefix
    # predicts each of them from exactly its own context.
    head = positions[positions <= window]
    if head.numel():
        logits, _ = model(ids[:window].unsqueeze(0))
        total = total.add(score_batch(logits[0, head - 1], ids[head], token_char_lengths))
    # Every later target t: the window ids[t - window : t].
    tail = positions[positions > window]
    offsets = torch.arange(-window, 0, device=ids.device)
    per_batch = max(1, batch_tokens // window)
    for chunk in tail.split(per_batch):
        logits, _ = model(ids[chunk.unsqueeze(1) + offsets])
        total = total.add(score_batch(logits[:, -1], ids[chunk], token_char_lengths))
    model.train(was_training)
    return total


def sees_whole_window(model, window: int) -> bool:
    """A finite-context model (context <= window) sees the same in a window as in the whole history."""
    context = getattr(model, "context", None)
    return context is not None and context <= window


@torch.no_grad()
def _score_in_one_pass(model, ids: Tensor, stride: int, token_char_lengths: Tensor, chunk: int = 1 << 12) -> Score:
    """Targets 1, 1 + stride, ... of `ids`, each from everything before it (one stream, the state
    carried from chunk to chunk)."""
    was_training = model.training
    model.eval()
    positions = torch.arange(1, ids.numel(), stride, device=ids.device)
    total, state = Score(), None
    inputs = ids[:-1]
    for start in range(0, inputs.numel(), chunk):
        logits, state = model(inputs[start:start + chunk].unsqueeze(0), state)
        wanted = positions[(positions > start) & (positions <= start + logits.shape[1])]
        total = total.add(score_batch(logits[0, wanted - 1 - start], ids[wanted], token_char_lengths))
    model.train(was_training)
    return total


def windowed_stride(stride: int | str, n_targets: int, window: int, training_tokens: int | None = None) -> int:
    """`stride` as an int. "auto" scores every target (exact) unless that would run more tokens
    through the model than training did (training_tokens: steps x batch x seq_len, forward passes
    only); then every k-th target, the smallest such k. So a full recipe is scored exactly, a
    smoke run of a few steps quickly, and the choice never depends on the hardware."""
    if stride != "auto":
        return int(stride)
    if not training_tokens:
        return 1
    return max(1, math.ceil(n_targets * window / training_tokens))


def evaluate_modes(model, train_ids: Tensor, val_ids: Tensor, token_char_lengths: Tensor, *, seq_len: int,
                   streams: int, window: int, windowed_stride: int = 1,
                   batch_tokens: int = 1 << 16) -> dict[str, Score]:
    """The whole validation split in every inference mode, plus the training split's bigram table."""
    device = model.device
    val_ids, token_char_lengths = val_ids.to(device), token_char_lengths.to(device)
    return {
        "stateful": score_stateful(model, val_ids, seq_len, streams, token_char_lengths),
        "stateless": score_stateless(model, val_ids, token_char_lengths),
        "windowed": score_windowed(model, val_ids, window, token_char_lengths, windowed_stride, batch_tokens),
        "bigram": score_bigram(train_ids.to(device), val_ids, token_char_lengths),
    }


def mode_metrics(scores: dict[str, Score]) -> dict[str, float]:
    """{"stateful_nll": ..., "stateful_bpc": ..., ...} for summary.json and the loggers."""
    metrics = {}
    for mode, score in scores.items():
        metrics[f"{mode}_nll"] = score.nll
        metrics[f"{mode}_bpc"] = score.bpc
    return metrics


def format_modes(scores: dict[str, Score]) -> str:
    lines = [f"{'mode':<10} {'nats/token':>10} {'bits/char':>10} {'targets':>9}"]
    for mode, score in scores.items():
        lines.append(f"{mode:<10} {score.nll:>10.4f} {score.bpc:>10.4f} {score.tokens:>9,}")
    return "\n".join(lines)


def evaluate_from_config(model, train_ids: Tensor, val_ids: Tensor, token_char_lengths: Tensor, seq_len: int,
                         settings, training_tokens: int | None = None) -> tuple[dict[str, Score], dict]:
    """`evaluate_modes` with the `evaluation` config group's settings (conf/evaluation/default.yaml);
    returns the scores and the settings actually used (window and stride resolved)."""
    window = int(settings.get("window") or seq_len)
    n_targets = val_ids.numel() - 1
    stride = windowed_stride(settings.get("windowed_stride", "auto"), n_targets, window, training_tokens)
    if sees_whole_window(model, window) and settings.get("windowed_stride", "auto") == "auto":
        stride = 1  # exact at the cost of one pass (see score_windowed)
    used = {"seq_len": seq_len, "streams": int(settings.streams), "window": window, "windowed_stride": stride,
            "windowed_targets": len(range(1, n_targets + 1, stride))}
    scores = evaluate_modes(model, train_ids, val_ids, token_char_lengths, seq_len=seq_len,
                            streams=used["streams"], window=used["window"], windowed_stride=stride,
                            batch_tokens=int(settings.get("batch_tokens", 1 << 16)))
    return scores, used
