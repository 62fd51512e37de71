"""Dynamic evaluation (Krause, Kahembwe, Murray & Renals 2018), the fourth inference mode: after each segment of
the stateful layout the weights take a step on the text just scored (`sgd`, or Krause's `rms`); each segment is
scored before the update it causes, and the weights are put back bit for bit after the pass (`restored`). The
formulas: docs/configuration.md; the figure: docs/evaluation.md.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor

from gru_experiments.data.batches import IGNORE_INDEX
from gru_experiments.errors import UserError
from gru_experiments.models.protocol import map_state
from gru_experiments.study.generation import eval_mode, plain_logits
from gru_experiments.study.scores import (
    Score,
    Split,
    StatefulChunk,
    _score_nll,
    stream_rows,
    target_nll,
)
from gru_experiments.validation import Rule, check_rules, int_at_least, is_number

RULES, PARTS = ("sgd", "rms"), ("all", "head", "recurrence")
EPSILON = 2e-5  # rms: Krause's ε, added to MS in the step's denominator (his code's default)
STATISTICS_STREAMS = 64  # rms: MS gathered on the training split as this many streams side by side (Krause: 100)
DIVERGED = 10  # a segment's mean NLL above this many times a uniform guess's (ln V): the adaptation diverged
BACKWARD_COST = 2  # forward tokens a backward pass costs, per token (the plan's price of a segment: 1 + this)


@dataclass(frozen=True)
class DynamicSettings:
    """evaluation.dynamic (conf/evaluation/default.yaml; docs/configuration.md): the rule, η (`lr`), λ (`decay`),
    the tokens between updates (`segment`), the reset (`reset_every` tokens; None: never), which weights adapt
    (`params`), and the training tokens rms gathers its MS on (`statistics`; None: the whole training split)."""
    rule: str
    lr: float
    decay: float
    segment: int
    reset_every: int | None
    params: str
    statistics: int | None
    RULES: ClassVar = [
        Rule("rule", lambda v: v in RULES, " or ".join(RULES)),
        Rule("lr", lambda v: is_number(v) and v >= 0, "a number >= 0 (η; 0: the stateful figure)"),
        Rule("decay", lambda v: is_number(v) and 0 <= v <= 1, "a number from 0 to 1 (λ, toward the trained weights)"),
        Rule("segment", int_at_least(1), "an integer >= 1 (tokens between updates)"),
        Rule("reset_every", int_at_least(1), "null (never) or an integer >= dynamic.segment", optional=True),
        Rule("params", lambda v: v in PARTS, " or ".join(PARTS)),
        Rule("statistics", int_at_least(1), "null (the whole training split) or an integer >= 1", optional=True)]

    def __post_init__(self):
        check_rules(self.__dict__, self.RULES, "evaluation.dynamic.")
        if self.reset_every is not None and self.reset_every < self.segment:
            raise UserError(f"invalid evaluation.dynamic.reset_every={self.reset_every}: below dynamic.segment="
                            f"{self.segment}, the weights would go back before a single update; give null (never) "
                            f"or an integer >= {self.segment}")

    @classmethod
    def of(cls, node, default_file) -> DynamicSettings:
        """The node (None: absent, as in a run recorded before it) over the defaults of `default_file`."""
        defaults = OmegaConf.to_container(OmegaConf.load(default_file))["dynamic"]
        node = {} if node is None else dict(node)
        check_rules(node, [], "evaluation.dynamic.", known=[rule.key for rule in cls.RULES])
        return cls(**(defaults | node))

    def record(self) -> dict:
        return asdict(self)


# --- the update ------------------------------------------------------------------------------------------
class Adapter:
    """The adapted weights of one pass: θ₀ (the trained), the rule's step, the reset. rms: MS (root-mean-square
    gradient on the training split, per weight) and the decay rates MS / mean(MS) clipped at 1/λ (Krause's code)."""

    def __init__(self, model, settings: DynamicSettings, statistics: dict[str, Tensor] | None = None):
        names = model.dynamic_parts()[settings.params]
        if not names:
            raise UserError(f"evaluation.dynamic.params={settings.params} names no weight of this "
                            f"{model.family} model; choose one of {', '.join(PARTS)}")
        weights = dict(model.named_parameters())
        self.s, self.names = settings, names
        self.params = [weights[n] for n in names]
        self.trained = [p.detach().clone() for p in self.params]
        self.ms = self.rate = None
        if settings.rule == "rms" and settings.lr > 0:  # lr = 0 makes no step
            if statistics is None:
                raise UserError("evaluation.dynamic.rule=rms gathers its statistics on the training split, which "
                                "this evaluation lacks; give rule=sgd, or score a run whose corpus is known")
            mean = sum(m.mean() for m in statistics.values()) / len(statistics)  # over every weight (Krause's gsum)
            self.ms = [statistics[n] for n in names]
            clip = math.inf if settings.decay == 0 else 1 / settings.decay
            self.rate = [(m / mean).clamp(max=clip) for m in self.ms]

    def step(self, grads: list[Tensor]) -> None:
        """One update from the segment's gradients: sgd θ ← θ − η g + λ (θ₀ − θ); rms θ ← θ + λ r ⊙ (θ₀ − θ) −
        η g / (MS + ε), r = min(MS / mean MS, 1/λ)."""
        lr, decay = self.s.lr, self.s.decay
        with torch.no_grad():
            for i, (p, g, p0) in enumerate(zip(self.params, grads, self.trained)):
                if self.ms is None:
                    p.add_(decay * (p0 - p) - lr * g)
                else:
                    p.add_(decay * self.rate[i] * (p0 - p) - lr * g / (self.ms[i] + EPSILON))

    def reset(self) -> None:
        with torch.no_grad():
            for p, p0 in zip(self.params, self.trained):
                p.copy_(p0)

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.params)


@contextmanager
def restored(model):
    """The model's weights, their gradients and requires_grad flags as they were, bit for bit, on leaving (an
    exception included): no later figure, checkpoint or sample sees adapted weights."""
    saved = [(p, p.detach().clone(), p.grad, p.requires_grad) for p in model.parameters()]
    try:
        yield model
    finally:
        with torch.no_grad():
            for p, data, grad, flag in saved:
                p.copy_(data)
                p.grad = grad
                p.requires_grad_(flag)


def _segments(model, inputs: Tensor, targets: Tensor, segment: int, plain, adapted: list[Tensor], tick=None,
              per_stream: bool = True, features: bool = False):
    """The carried loop with gradients: yields (start, every target's NLL (R, t) in nats, the gradient w.r.t.
    `adapted` (None when nothing adapts or nothing is scored) of ℓ: each stream's mean NLL over the segment, summed
    over the streams (per_stream; so η means per stream what it means for one), or the mean over all (rms's
    statistics, Krause's batch)), and with `features` the final hidden states (R, t, C) that scored them (the
    protocol's forward_features), else None; the state carried, detached."""
    state = None
    for start in range(0, inputs.shape[1], segment):
        chunk = targets[:, start:start + segment]
        with torch.enable_grad():
            if features:
                logits, state, hidden = model.forward_features(inputs[:, start:start + segment], state)
            else:
                (logits, state), hidden = model(inputs[:, start:start + segment], state), None
            nll = _nll(logits, chunk, plain)
            counts = (chunk != IGNORE_INDEX).sum(dim=1)
            loss = (nll.sum(dim=1) / counts.clamp(min=1)).sum() if per_stream else nll.sum() / counts.sum()
            grads = torch.autograd.grad(loss, adapted) if adapted and int(counts.sum()) else None
        state = map_state(lambda s: s.detach(), state)
        if tick is not None:
            tick(chunk.numel())
        yield start, nll.detach(), grads, None if hidden is None else hidden.detach()


def _nll(logits: Tensor, targets: Tensor, plain) -> Tensor:
    """scores.target_nll (float32 logits, its figures to the digit), float64 kept where the model runs in it."""
    if logits.dtype == torch.float64:
        logits = plain_logits(logits.reshape(-1, logits.shape[-1]), plain)
        return F.cross_entropy(logits, targets.reshape(-1).long(), ignore_index=IGNORE_INDEX,
                               reduction="none").view(targets.shape)
    return target_nll(logits, targets, plain).view(targets.shape)


def statistics_ids(train_ids: Tensor, settings: DynamicSettings) -> Tensor:
    """The training tokens rms gathers its MS on: the first `statistics` (and the one they predict), or all."""
    return train_ids if settings.statistics is None else train_ids[:settings.statistics + 1]


def gradient_statistics(model, train_ids: Tensor, settings: DynamicSettings, tick=None) -> dict[str, Tensor]:
    """rms's MS: per weight, the root mean square over the training split's segments (STATISTICS_STREAMS streams
    side by side, the state carried, its first `statistics` tokens) of the segment's mean-NLL gradient. tick: called
    with the tokens of each segment (a progress bar's)."""
    ids = statistics_ids(train_ids, settings)
    inputs, targets, _, _ = stream_rows(ids, STATISTICS_STREAMS)
    names, params = zip(*model.named_parameters())
    squares, batches = [torch.zeros_like(p) for p in params], 0
    with restored(model), eval_mode(model):
        for p in params:
            p.requires_grad_(True)
        for _, _, grads, _ in _segments(model, inputs, targets, settings.segment, None, list(params), tick,
                                        per_stream=False):
            if grads is not None:
                for total, g in zip(squares, grads):
                    total.add_(g * g)
                batches += 1
    return {n: (total / max(batches, 1)).sqrt() for n, total in zip(names, squares)}


@dataclass
class DynamicScore:
    """A dynamic pass: its Score (every target's NLL kept), the settings, and where it diverged (None: it did
    not: every target scored)."""
    score: Score
    settings: DynamicSettings
    streams: int
    stride: int
    updates: int
    diverged_at: int | None = None


def _adapt(model, inputs: Tensor, targets: Tensor, settings: DynamicSettings, statistics, plain, tick=None,
           features: bool = False):
    """The adapting loop, leaving the weights adapted (callers restore them): yields (start, the segment's NLLs
    (R, t), None or at a divergence "diverged", its final hidden states with `features`)."""
    adapter = Adapter(model, settings, statistics)
    learns = settings.lr > 0  # lr = 0: the weights never move (θ₀ - θ = 0), so no gradient is taken
    for p in model.parameters():
        p.requires_grad_(False)
    for p in adapter.params:
        p.requires_grad_(learns)
    reset, last = settings.reset_every, 0
    diverged = DIVERGED * math.log(model.vocab_size)
    for start, nll, grads, hidden in _segments(model, inputs, targets, settings.segment, plain,
                                               adapter.params if learns else [], tick, features=features):
        if not bool(torch.isfinite(nll).all()) or float(nll.mean()) > diverged:
            yield start, nll, "diverged", hidden
            return
        if grads is not None:
            adapter.step(grads)
            if not adapter.finite():
                yield start, nll, "diverged", hidden
                return
        yield start, nll, None, hidden
        following = start + settings.segment  # reset before the first segment at or past each multiple
        if reset is not None and following // reset > last // reset:
            adapter.reset()
            last = following


def score_dynamic(model, split: Split, settings: DynamicSettings, streams: int, *, stride: int = 1,
                  statistics: dict[str, Tensor] | None = None, tick=None, read=None) -> DynamicScore:
    """Dynamic evaluation of `split`: `streams` contiguous streams (score_stateful's layout; every stride-th),
    in segments of settings.segment, each segment scored and then its update made; the weights back to the trained
    ones every reset_every tokens of a stream, and after the pass. A non-finite loss or weight, or a segment's
    mean NLL over DIVERGED times ln V, stops the pass: the result says where (`diverged_at`, a stream position)
    and holds no figure. read: called with every segment as a scores.StatefulChunk (its final hidden states, the
    adapted model's, as features; no logits), as score_stateful's readers are (the cache over it)."""
    inputs, targets, rows, length = stream_rows(split.ids, streams, stride)
    if settings.segment > length:
        raise UserError(f"invalid evaluation.dynamic.segment={settings.segment}: longer than the {length:,} "
                        f"tokens of each of the split's {rows.numel()} stream(s); give at most {length:,}")
    positions = rows.unsqueeze(1) * length + torch.arange(length, device=rows.device) + 1
    kept, learns = [], settings.lr > 0
    with restored(model), eval_mode(model):
        for start, nll, diverged, hidden in _adapt(model, inputs, targets, settings, statistics, split.plain, tick,
                                                   features=read is not None):
            if diverged:
                return DynamicScore(Score(), settings, int(rows.numel()), stride, len(kept) * learns, start)
            kept.append(nll)
            if read is not None:
                chunk = targets[:, start:start + settings.segment]
                read(StatefulChunk(rows, length, start, None, chunk, nll.float(), hidden))
    nll, scored = torch.cat(kept, dim=1), targets != IGNORE_INDEX
    score = _score_nll(nll[scored], targets[scored], split.char_lengths).of(split.n_targets)
    return DynamicScore(score.with_targets([positions[scored]], [nll[scored]]), settings, int(rows.numel()),
                        stride, len(kept) * learns)


@contextmanager
def adapted_to(model, ids: Tensor, settings: DynamicSettings, statistics=None, plain=None, tick=None):
    """Inside the block, the model's weights adapted to `ids` (one stream, each segment's update as score_dynamic
    makes it; a diverging adaptation is refused in one line); the trained weights again after it. sample.py's and
    the API's prompt: what is generated inside never updates them. tick: called with each segment's tokens, as the
    adaptation runs (before the block)."""
    inputs, targets, _, _ = stream_rows(ids, 1)
    with restored(model):
        with eval_mode(model):
            for start, _, diverged, _ in _adapt(model, inputs, targets, settings, statistics, plain, tick):
                if diverged:
                    raise UserError(f"the adaptation to the prompt diverged at token {start:,} (a non-finite loss "
                                    f"or weight, or a loss over {DIVERGED} times a uniform guess's): give a smaller "
                                    "evaluation.dynamic.lr")
        for p in model.parameters():
            p.requires_grad_(False)
        yield model
