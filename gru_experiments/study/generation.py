"""Generating text with a trained model in the study's three inference modes (docs/internals.md, *Generating
text*), through the model's state interface alone; and what every pass shares: `eval_mode` and the progress bars.
"""

import contextlib
import os
import sys
import zlib
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from gru_experiments.data.tokenizers import encode_prompt, plain_tokens
from gru_experiments.errors import UserError
from gru_experiments.models.cuda_graphs import graphed
from gru_experiments.models.protocol import map_state
from gru_experiments.study.modes import MODES, STATEFUL, STATELESS, WINDOWED
from gru_experiments.validation import Rule, check_rules, int_at_least, is_int, is_number, temperature_rule


@contextlib.contextmanager
def eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class Progress:
    """Progress bars (tqdm, as Lightning's own bar) in forward tokens, one per pass, so that every bar fills at
    the rate the model runs; off with trainer.enable_progress_bar=false. `with progress.phase(name, total) as
    tick: ...; tick(tokens_run)`."""

    def __init__(self, enabled: bool = True, prefix: str = "evaluation", lines: bool = False):
        self.enabled, self.prefix, self.lines = enabled, prefix, lines  # lines: without bars, a line per pass

    @contextlib.contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if not self.enabled:
            if self.lines:
                print(f"{self.prefix}: {name}, {int(total):,} tokens", flush=True)
            yield lambda _: None
            return
        from tqdm.auto import tqdm

        with tqdm(total=int(total), desc=f"{self.prefix}: {name}", unit="tok", unit_scale=True, leave=True,
                  dynamic_ncols=True, file=sys.stderr, mininterval=1.0) as bar:
            yield bar.update
            bar.n = bar.total  # a sampled pass may run a few tokens fewer than planned; close shows it full


NO_PROGRESS = Progress(enabled=False)


STUDY_PROMPTS = ("ROMEO: ", "KING: ", "FIRST CITIZEN: ")

Chooser = Callable[[Tensor], Tensor]


def validate_sampling(settings, vocab_size: int | None, prefix: str = "") -> None:
    """The one check of sampling settings (sample.py, the Python API, `generate`): absent keys skipped,
    null top_k, top_p and window "off"; `vocab_size` bounds top_k (None: not known yet); `prefix` spells
    the keys as on the command line ("sample." gives "invalid sample.top_k=0")."""
    top_k = "null (off) or an integer from 1 to the vocabulary size"
    top_k = ((lambda v: is_int(v) and 1 <= v <= vocab_size), f"{top_k} {vocab_size}") if vocab_size is not None \
        else (int_at_least(1), top_k)
    rules = [
        temperature_rule(),
        Rule("top_k", *top_k, optional=True),
        Rule("top_p", lambda v: is_number(v) and 0 < v <= 1, "null (off) or a number in (0, 1]", optional=True),
        Rule("num_samples", int_at_least(1), "an integer >= 1", may_be_absent=True),
        Rule("max_new_tokens", int_at_least(1), "an integer >= 1", may_be_absent=True),
        Rule("window", int_at_least(1), "null or an integer >= 1 (tokens of context)", optional=True),
        Rule("seed", is_int, "an integer", may_be_absent=True),
        Rule("greedy", lambda v: isinstance(v, bool), "true or false", may_be_absent=True),
    ]
    check_rules(settings, rules, prefix)


@dataclass(frozen=True)
class Decoding:
    """Temperature, top-k and top-p combined, in that order; greedy (or temperature 0): the argmax alone."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    greedy: bool = False

    def __post_init__(self):
        validate_sampling(asdict(self), None)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


def plain_logits(logits: Tensor, plain: Tensor | None) -> Tensor:
    """logits (..., V) with every token outside `plain` ((V,) bool: the corpus's own symbols; None: all) at
    -inf: the one place a probe-trained model's plain-text figures and samples leave the probe's out."""
    return logits if plain is None else logits.masked_fill(~plain.to(logits.device), float("-inf"))


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> Tensor:
    """logits (..., V) scaled by 1/temperature, every token outside the top-k (ties kept) and outside the
    nucleus (the most probable tokens whose probabilities first reach top_p) at -inf."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # A token is dropped when the tokens ranked above it already hold top_p of the mass,
        # so the most probable token always stays.
        mass_above = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_above >= top_p
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def make_chooser(decoding: Decoding, generator: torch.Generator | None = None, plain: Tensor | None = None) -> Chooser:
    """The function (B, V) logits -> (B,) ids of `decoding` over `plain`, drawing from `generator` only."""
    if decoding.is_greedy:
        return lambda logits: plain_logits(logits, plain).argmax(dim=-1)
    temperature, top_k, top_p = decoding.temperature, decoding.top_k, decoding.top_p

    def choose(logits: Tensor) -> Tensor:
        probs = filter_logits(plain_logits(logits.float(), plain), temperature, top_k, top_p).softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return choose


@torch.no_grad()  # not inference_mode: a CUDA graph's static buffers must stay writable outside it
def sample_tokens(model, prompt: Tensor, max_new_tokens: int, mode: str, choose: Chooser,
                  window: int | None = None) -> Tensor:
    """The tokens (B, max_new_tokens) generated after prompt (B, P) in `mode` (one of MODES), the model in
    eval mode meanwhile: stateful, the prompt in one pass and then a token a step, the state carried;
    stateless, a token a step from a fresh zero state; windowed, the last `window` tokens a step."""
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be a non-empty (batch, length) tensor of token ids, got shape "
                         f"{tuple(prompt.shape)}")
    if mode not in MODES:
        raise ValueError(f"unknown inference mode {mode!r}; choose one of {MODES}")
    if mode == WINDOWED:
        if window is None:
            raise ValueError("windowed sampling needs a window (tokens of context)")
        if getattr(model, "context", None) is not None:  # it sees at most `context` tokens of any window
            window = max(1, min(window, model.context))
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
    start, state = prompt.shape[1], None
    tokens = torch.cat([prompt, prompt.new_empty(prompt.shape[0], max_new_tokens)], dim=1)
    with eval_mode(model):
        forward = graphed(model)  # on CUDA, the one-token step replayed from a graph (models/cuda_graphs.py)
        for end in range(start, start + max_new_tokens):
            if mode == STATEFUL:
                logits, state = forward(prompt if end == start else tokens[:, end - 1:end], state)
            else:
                logits, _ = forward(tokens[:, max(0, end - (1 if mode == STATELESS else window)):end])
            tokens[:, end] = choose(logits[:, -1])
    return tokens[:, start:]


# --- will it fit? ---------------------------------------------------------------------------

def generation_bytes(model, prompt_len: int, max_new_tokens: int, num_samples: int, mode: str,
                     window: int | None = None) -> dict[str, int]:
    """A lower bound on the memory the sampler of `mode` allocates at once, by buffer: the token ids, the
    logits of its longest forward pass, the chooser's probabilities, the model state (the model's
    activations come on top)."""
    B, V = int(num_samples), int(model.vocab_size)
    total_len = int(prompt_len) + int(max_new_tokens)
    if mode == STATEFUL:
        fed = max(int(prompt_len), 1)
    elif mode == WINDOWED:
        fed = min(int(window or 1), total_len - 1)
        if getattr(model, "context", None) is not None:
            fed = min(fed, max(1, model.context))
    else:
        fed = 1
    state = []  # the bytes of each tensor of one sample's state, built where it costs nothing
    try:
        map_state(lambda s: state.append(s.numel() * s.element_size()), model.initial_state(1, device="meta"))
    except Exception:  # a model that cannot build its state on the meta device: count none
        state = []
    return {"token buffer": B * total_len * 8, "logits": B * fed * V * 4, "probabilities": B * V * 4,
            "model state": B * sum(state)}


def memory_available(device) -> tuple[int, str] | None:
    """(bytes a new allocation can use on `device`, how to say it), or None when unknown: CUDA's free memory
    and what torch holds unused; a CPU's physical memory (a request above it cannot succeed)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free, f"{device} has {format_bytes(free)} free of {format_bytes(total)}"
    if device.type == "cpu":
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # no sysconf (Windows): leave it to the allocator
            return None
        return total, f"this machine has {format_bytes(total)} of memory"
    return None


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_generation_fits(model, prompt_len: int, max_new_tokens: int, num_samples: int, mode: str,
                          window: int | None = None) -> None:
    """UserError, before anything is allocated (not a failure mid-way, or hours of swap), when the request's
    buffers (`generation_bytes`) exceed the memory of the model's device."""
    available = memory_available(model.device)
    if available is None:
        return
    limit, where = available
    parts = generation_bytes(model, prompt_len, max_new_tokens, num_samples, mode, window)
    request = (f"num_samples={num_samples} x (prompt {prompt_len} + max_new_tokens={max_new_tokens}) tokens"
               + (f", window={window}" if mode == WINDOWED else ""))
    advice = "ask for fewer samples (num_samples) or fewer tokens (max_new_tokens)"
    if parts["token buffer"] > limit:
        raise UserError(f"{request} would need {format_bytes(parts['token buffer'])} for the token buffer alone; "
                        f"{where}; {advice}")
    needed = sum(parts.values())
    if needed > limit:
        shown = ", ".join(f"{name} {format_bytes(size)}" for name, size in parts.items() if size)
        raise UserError(f"{request} in {mode} mode would need at least {format_bytes(needed)} ({shown}); {where}; "
                        f"{advice}" + (" or a shorter window (evaluation.window)" if mode == WINDOWED else ""))


def generate(model, prompt_ids: Sequence[int], *, mode: str, max_new_tokens: int, num_samples: int = 1,
             decoding: Decoding = Decoding(), seed: int = 0, window: int | None = None,
             plain: Tensor | None = None, progress: Progress = NO_PROGRESS) -> Tensor:
    """`num_samples` continuations of one prompt as one batch (num_samples, N), of the tokens `plain` allows.
    Every generation path comes through here or generate_decodings: a nonsense size or a request too large for
    the device raises a UserError before anything is allocated. The draws come from a generator seeded with `seed`
    alone: the same seed, the same text (on the same device). `progress`: a bar in tokens generated."""
    return generate_decodings(model, prompt_ids, mode=mode, max_new_tokens=max_new_tokens, num_samples=num_samples,
                              decodings=[decoding], seed=seed, window=window, plain=plain, progress=progress)[0]


def generate_decodings(model, prompt_ids: Sequence[int], *, mode: str, max_new_tokens: int, num_samples: int,
                       decodings: Sequence[Decoding], seed: int = 0, window: int | None = None,
                       plain: Tensor | None = None, progress: Progress = NO_PROGRESS) -> list[Tensor]:
    """`generate` for each of `decodings`, as one batch of len(decodings) x num_samples rows: each decoding's rows
    draw from their own generator seeded with `seed`, as `generate` would, in one sequence of forward passes
    instead of one per decoding (the text statistics' settings: a windowed step costs a whole window)."""
    validate_sampling({"num_samples": num_samples, "max_new_tokens": max_new_tokens, "window": window},
                      model.vocab_size)
    prompt_ids, rows = list(prompt_ids), len(decodings) * num_samples
    check_generation_fits(model, len(prompt_ids), max_new_tokens, rows, mode, window)
    device = model.device
    prompt = torch.tensor(prompt_ids, dtype=torch.long, device=device).expand(rows, -1)
    choosers = [make_chooser(d, generator=torch.Generator(device=device).manual_seed(seed), plain=plain)
                for d in decodings]
    with progress.phase(mode, total=rows * max_new_tokens) as tick:
        def choose(logits: Tensor) -> Tensor:  # every sampler chooses once per step: its bar moves there
            tick(len(logits))
            return torch.cat([c(part) for c, part in zip(choosers, logits.split(num_samples))])

        return list(sample_tokens(model, prompt.contiguous(), max_new_tokens, mode, choose, window).split(num_samples))


def prompt_seed(seed: int, prompt: str) -> int:
    """The seed of a prompt's samples, from `seed` and its text: independent of the other prompts."""
    return (seed + zlib.crc32(prompt.encode("utf-8"))) % 2**63


def continuations(model, tokenizer, prompt: str, decodings: Sequence[Decoding], *, seed: int,
                  **settings) -> list[list[str]]:
    """Per decoding, the texts generate_decodings continues `prompt` with, drawn with `prompt_seed`: plain
    text, never one of the tokenizer's extra symbols (the recall probe's: tokenizers.plain_tokens)."""
    drawn = generate_decodings(model, encode_prompt(tokenizer, prompt), decodings=decodings,
                               seed=prompt_seed(seed, prompt), plain=plain_tokens(tokenizer), **settings)
    return [[tokenizer.decode(row) for row in rows.tolist()] for rows in drawn]


def sample_texts(model, tokenizer, prompts: Sequence[str], *, mode: str, max_new_tokens: int,
                 num_samples: int = 1, decoding: Decoding = Decoding(), seed: int = 0,
                 window: int | None = None, progress: Progress = NO_PROGRESS) -> list[list[str]]:
    """For each prompt, `num_samples` texts (prompt + its continuations); a bar each."""
    return [[prompt + text for text in continuations(
        model, tokenizer, prompt, [decoding], seed=seed, mode=mode, max_new_tokens=max_new_tokens,
        num_samples=num_samples, window=window, progress=progress)[0]] for prompt in prompts]


def tokens_for_chars(chars: int, split) -> int:
    """How many tokens make about `chars` characters at the mean token length of `split` (a scores.Split)."""
    mean_length = split.characters / split.ids.numel() if split.ids.numel() else 1.0
    return max(1, round(chars / max(mean_length, 1e-9)))


def spellable_prompts(tokenizer, prompts: Sequence[str], fallback_ids: Tensor, fallback_tokens: int = 8) -> list[str]:
    """The prompts the vocabulary spells; if none, the text of the first `fallback_ids`: any corpus gets some."""
    usable = [p for p in prompts if p and not tokenizer.unknown_characters(p)]
    return usable or [tokenizer.decode(fallback_ids[:fallback_tokens].tolist())]


def side_by_side_samples(model, tokenizer, prompts: Sequence[str] = STUDY_PROMPTS, *, max_new_tokens: int,
                         decoding: Decoding = Decoding(), seed: int = 0) -> dict:
    """The same prompts, weights and seed, sampled statefully and statelessly (read by the sweep report):
    {"prompts", "stateful", "stateless": a text per prompt, "settings"}."""
    samples = {"prompts": list(prompts)}
    for mode in (STATEFUL, STATELESS):
        texts = sample_texts(model, tokenizer, prompts, mode=mode, max_new_tokens=max_new_tokens,
                             decoding=decoding, seed=seed)
        samples[mode] = [per_prompt[0] for per_prompt in texts]
    return samples | {"settings": dict(max_new_tokens=max_new_tokens, seed=seed, **asdict(decoding))}
