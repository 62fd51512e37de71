"""What an evaluation costs, beside the plan it prices (study/plan.py): its forward tokens at the rate of each
pass's shape on this machine (EvaluationClock, a quick calibration), the estimate a training prints after its first
steps (`estimate`), and the one line that says before an evaluation what it will run (`describe_plan`).
docs/sweeps.md."""

import time
import weakref
from functools import partial

import torch

from gru_experiments.data.token_ids import ids_dtype
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.protocol import WINDOW_BATCH_TOKENS
from gru_experiments.study.cache import SHARPNESS, StreamStates, cache_sizes, cache_stride, continuous_cache
from gru_experiments.study.evaluation import EvaluationSettings
from gru_experiments.study.generation import eval_mode
from gru_experiments.study.modes import DYNAMIC, STATEFUL, WINDOWED
from gru_experiments.study.plan import CURVE, MODE, TEXT, Plan, StatefulPass
from gru_experiments.study.scores import Split, score_stateful, score_table, stream_layout


def describe_plan(plan, train_tokens: int, settings: EvaluationSettings) -> str:
    """One line before the evaluation runs: its forward tokens by entry and, within a budget, what it samples or
    leaves out, and the key that scores everything."""
    by_owner = {}
    for p, owner in zip(plan.passes, plan.owners):
        by_owner[owner] = by_owner.get(owner, 0) + p.forward_tokens
    parts = ", ".join(f"{owner} {tokens:,}" for owner, tokens in by_owner.items() if tokens)
    line = (f"evaluation: {plan.forward_tokens:,} forward tokens ({parts}; "
            f"{plan.forward_tokens / max(train_tokens, 1):,.2f} per token trained), ")
    if plan.budget is None:
        return line + "every figure exact (evaluation.budget=null)"
    sampled = [f for f in plan.figures if f.kind in (MODE, CURVE) and f.targets < plan.split_targets]
    names = [f.name for f in sampled if f.kind == MODE] + (["the context curve"] if any(
        f.kind == CURVE for f in sampled) else [])
    listed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + (names[-1] if names else "")
    left = [f"{listed} sampled, with their standard errors"] if names else []
    text = next((p for p, owner in zip(plan.passes, plan.owners) if owner == TEXT), None)
    asked = settings.text
    if text is None and asked.samples:
        left.append("no text statistics")
    elif text is not None and (text.targets < asked.samples or (asked.drift_chars and not text.drift)):
        left.append(f"text statistics on {text.targets} of {asked.samples} samples per setting"
                    + (", no drift" if asked.drift_chars and not text.drift else ""))
    if "recall" in by_owner:
        left.append("the recall figures exact, outside the budget")
    return line + f"within evaluation.budget={settings.budget} ({plan.budget:,} forward tokens)" + (
        f": {'; '.join(left)} (evaluation.budget=null: everything)" if left else ", everything exact")


CALIBRATION_REPEATS = 3  # each shape timed this many times after a warm-up, the fastest kept
_CLOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class EvaluationClock:
    """Seconds per forward token of `model` on this machine, by the shape of the call, measured on first use (a few
    forward passes: well under a second for the study's models), so that the estimate says time, not tokens."""

    def __init__(self, model, seq_len: int):
        self.model, self.seq_len, self._seconds = model, int(seq_len), {}

    @classmethod
    def of(cls, model, seq_len: int) -> "EvaluationClock":
        """The model's clock, measured once per process (every estimate of a run reads the same)."""
        clock = _CLOCKS.get(model)
        if clock is None or clock.seq_len != int(seq_len):
            clock = _CLOCKS[model] = cls(model, seq_len)
        return clock

    def call(self, rows: int, length: int) -> float:
        """Seconds of one forward call of `rows` x `length` tokens."""
        key = (max(1, int(rows)), max(1, int(length)))
        return self._rate(key, 1, lambda generator: partial(self._forward, torch.zeros(
            key, dtype=torch.long, device=self.model.device)))

    def _forward(self, tokens) -> None:
        with torch.no_grad(), eval_mode(self.model):
            self.model(tokens)

    def per_token(self, rows: int, length: int) -> float:
        return self.call(rows, length) / (max(1, rows) * max(1, length))

    def pass_seconds(self, p) -> float:
        """A pass's seconds: its forward tokens at the rate of its shape (the text statistics': text_seconds)."""
        if p.kind == TEXT:
            return self.text_seconds(p)
        if p.kind == "table":  # a lookup per target (and the bigram's counting first): no model's forward
            return p.targets * self.table_rate() + p.counted * self.count_rate()
        if not p.forward_tokens:
            return 0.0
        if p.kind == DYNAMIC:  # its streams side by side, a segment a call (its backward priced in its tokens)
            return p.forward_tokens * self.per_token(p.streams, p.chunk)
        if p.kind == STATEFUL:  # the streams it scores (every stride-th) side by side, a chunk a call
            return p.forward_tokens * self.stateful_rate(len(range(0, p.streams, p.stride)), p.chunk, bool(p.readers))
        length = getattr(p, "window", 0) or getattr(p, "chunk", 0) or self.seq_len
        length = min(length, self.seq_len * 8)
        return p.forward_tokens * self.per_token(max(1, WINDOW_BATCH_TOKENS // length), length)

    def text_seconds(self, p) -> float:
        """The text statistics' sampling (TextPass.calls): a step per token generated, in windowed mode a window
        of tokens per row, else one."""
        return sum(forward * self.per_token(rows, self.seq_len) if mode == WINDOWED else steps * self.call(rows, 1)
                   for mode, rows, steps, forward in p.calls)

    def plan_seconds(self, plan) -> float:
        return sum(self.pass_seconds(p) for p in plan.passes) + self.cache_seconds(plan)

    def cache_seconds(self, plan) -> float:
        """The cache entry's seconds: no forward tokens of its own, but every query of the stateful pass's states
        against its last `longest` keys, at a rate timed once (cache.continuous_cache on a small segment)."""
        p = next((p for p in plan.passes if isinstance(p, StatefulPass)
                  and any(r.name == "cache" for r in p.readers)), None)
        if p is None or getattr(self.model, "family", None) == "ngram":  # no states to read: counted, cheap
            return 0.0
        streams, length = stream_layout(plan.split_targets, p.streams)
        rows = len(range(0, streams, p.stride))
        sizes = cache_sizes(plan.window, rows * length if p.stride == 1 and rows > 1 else length)
        queries = rows * length / cache_stride(rows * length, plan, self.model.device.type == "cpu")
        return queries * max(sizes) * self.cache_rate() if sizes else 0.0

    def _rate(self, key, units: int, prepare) -> float:
        """Seconds per unit of the work `prepare(generator)` returns (its inputs drawn outside the timing and the
        global RNG): the fastest of CALIBRATION_REPEATS timings after a warm-up (one is at the mercy of the machine)."""
        if key not in self._seconds:
            work, times = prepare(torch.Generator().manual_seed(0)), []
            work()
            for _ in range(CALIBRATION_REPEATS):
                started = time.perf_counter()
                work()
                times.append(time.perf_counter() - started)
            self._seconds[key] = min(times) / units
        return self._seconds[key]

    def stateful_rate(self, rows: int, chunk: int, read: bool) -> float:
        """Seconds per token of the stateful pass at its shape, `rows` streams side by side a chunk a call: what
        scores.score_stateful does besides the forward (the loss, each target's NLL) and, with `read`, the copy of
        every chunk's states its readers keep (cache.StreamStates); one chunk of each stream."""
        vocab, device = self.model.vocab_size, self.model.device
        return self._rate(("stateful", rows, chunk, read), rows * chunk, lambda generator: partial(
            score_stateful, self.model, Split(torch.randint(vocab, (rows * chunk + 1,), generator=generator).to(
                device, torch.int32), torch.ones(vocab, dtype=torch.long, device=device)), chunk, rows,
            read=StreamStates.of_chunk if read else None))

    def table_rate(self) -> float:
        """Seconds per target of a first-order table's scoring (scores.score_table, 2^21 targets at the scored
        split's int32: past the processor's caches, as a long split's are)."""
        vocab, device = self.model.vocab_size, self.model.device
        return self._rate("table", 1 << 21, lambda generator: partial(
            score_table, torch.zeros(vocab, vocab, dtype=torch.float64, device=device),
            Split(torch.randint(vocab, (1 << 21,), generator=generator).to(device, torch.int32),
                  torch.ones(vocab, dtype=torch.long, device=device))))

    def count_rate(self) -> float:
        """Seconds per training token of the bigram's counting (NGramLM.fit_in_chunks, 2^22 tokens at the width
        a prepared corpus's ids have, data.token_ids.ids_dtype)."""
        vocab = self.model.vocab_size
        return self._rate("count", 1 << 22, lambda generator: partial(
            NGramLM(vocab, order=2, smoothing="add_one").to(self.model.device).fit_in_chunks,
            torch.from_numpy(torch.randint(vocab, (1 << 22,), generator=generator).numpy().astype(
                ids_dtype(vocab)))))

    def cache_rate(self) -> float:
        """Seconds per (query, key) pair of the continuous cache, every θ (a segment of 1,024 against 512 keys)."""
        def prepare(generator):
            with torch.no_grad(), eval_mode(self.model):
                _, _, features = self.model.forward_features(torch.zeros(1, 1, dtype=torch.long,
                                                                         device=self.model.device))
            width = features.shape[-1] if features is not None else 256
            hidden = torch.randn(1, 1024, width, generator=generator).to(self.model.device, torch.bfloat16)
            targets = torch.randint(64, (1, 1024), generator=generator).to(self.model.device)
            return partial(continuous_cache, hidden, targets, [128, 256, 512], list(SHARPNESS))
        return self._rate("cache", 1024 * 512, prepare)

def duration(seconds: float) -> str:
    """Seconds as the estimates and the report write them: "9.5 s", "4 min 05 s", "1 h 02 min"."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def estimate(clock: EvaluationClock, *, step_seconds: float, steps_left: int, validations: int, val_targets: int,
             eval_batch_size: int, over_training: Plan, final: Plan, best: Plan, sample_steps: int = 0) -> dict:
    """The seconds left of a training: its steps at the measured rate, each validation left (the split in chunks
    and the modes over training's plan), the final weights' plan and its side-by-side samples (`sample_steps`
    tokens generated one at a time, one row: generation.side_by_side_samples) and, where the best checkpoint is
    not the final weights, the best checkpoint's plan."""
    chunks = val_targets * clock.per_token(eval_batch_size, clock.seq_len)
    e = {"step_seconds": step_seconds, "steps_left": steps_left, "train_seconds": steps_left * step_seconds,
         "validation_seconds": validations * (chunks + clock.plan_seconds(over_training)),
         "eval_forward_tokens": final.forward_tokens,
         "eval_seconds": clock.plan_seconds(final) + sample_steps * clock.call(1, 1),
         "best_forward_tokens": best.forward_tokens, "best_seconds": clock.plan_seconds(best)}
    e["total_seconds"] = e["train_seconds"] + e["validation_seconds"] + e["eval_seconds"]
    return e


def describe_estimate(e: dict) -> str:
    return (f"estimated time left: {duration(e['total_seconds'])} = training "
            f"{duration(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
            f"+ validation {duration(e['validation_seconds'])} + end-of-run evaluation "
            f"{duration(e['eval_seconds'])} ("
            + (f"{e['eval_seconds']:.0f} s, " if e['eval_seconds'] >= 90 else "")
            + f"{e['eval_forward_tokens']:,} forward tokens; "
            f"evaluation.budget bounds it), and {duration(e['best_seconds'])} more "
            f"({e['best_forward_tokens']:,}) if the best checkpoint is not the final weights")
