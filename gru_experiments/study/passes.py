"""The kinds of pass over the validation split, each with its cost and its run side by side: `plan`
counts its targets and forward tokens before anything runs (positions.py, model.forward_cost), `run`
runs it (scores.py): {context: Score} (None: its one figure). docs/evaluation.md: why each exists."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from gru_experiments.study.positions import congruent, stream_layout, warm_targets, window_targets
from gru_experiments.study.progress import NO_PROGRESS
from gru_experiments.study.scores import (
    ONE_PASS_CHUNK,
    chunks_cost,
    score_bigram,
    score_contexts,
    score_stateful,
    score_stateless,
)


@dataclass(frozen=True)
class Pass:
    """A pass: its targets, forward tokens, stride and keep_after (keep each target's NLL: None keeps none)."""
    kind: ClassVar[str] = "pass"
    targets: int = 0
    forward_tokens: int = 0
    stride: int = 1
    keep_after: int | None = None

    def run(self, request, progress=NO_PROGRESS) -> dict:
        """{context: result} on request.val (plan.Request) with request.model."""
        raise NotImplementedError


@dataclass(frozen=True)
class StatefulPass(Pass):
    """`streams` contiguous streams in chunks of `chunk` tokens, the state carried; every stride-th stream,
    whole. keep_after: keep the targets with at least this many tokens of their stream before them."""
    kind: ClassVar[str] = "stateful"
    chunk: int = 0
    streams: int = 1

    @classmethod
    def plan(cls, model, n: int, chunk: int, streams: int, keep_after: int | None, stride: int = 1) -> "StatefulPass":
        streams, length = stream_layout(n, streams)
        rows = range(0, streams, stride)
        forward = len(rows) * chunks_cost(model, length, chunk)
        targets = sum(max(0, min(length, n - s * length)) for s in rows)
        return cls(targets, forward, stride, keep_after, chunk, streams)

    @property
    def label(self) -> str:  # its progress bar's
        return "stateful" + ("" if self.stride == 1 else f", one stream in {self.stride}")

    def run(self, request, progress=NO_PROGRESS) -> dict:
        with progress.phase(self.label, self.targets) as tick:
            return {None: score_stateful(request.model, request.val, self.chunk, self.streams,
                                         targets_after=self.keep_after, tick=tick, stride=self.stride)}


@dataclass(frozen=True)
class WindowsPass(Pass):
    """Every stride-th target from its own window; the same windows give every shorter context in `contexts`."""
    kind: ClassVar[str] = "windows"
    window: int = 0
    contexts: tuple[int, ...] = ()
    targets_by_context: tuple[int, ...] = ()

    @classmethod
    def plan(cls, model, n: int, window: int, contexts, stride: int, keep: bool = False) -> "WindowsPass":
        windows = len(window_targets(n, window, window, stride)[1])
        forward = model.forward_cost(0, min(window, n + 1)) + windows * model.forward_cost(0, window)
        targets = []
        for w in contexts:
            head, _, tail = window_targets(n, window, w, stride)
            forward += len(tail) * model.forward_cost(0, w)
            targets.append(len(head) + windows + len(tail))
        contexts = tuple(contexts)  # `targets`: those of the longest context
        return cls(targets[contexts.index(max(contexts))], forward, stride, 0 if keep else None, window, contexts,
                   tuple(targets))

    def targets_at(self, context: int | None) -> int:
        return dict(zip(self.contexts, self.targets_by_context)).get(context, self.targets)

    def run(self, request, progress=NO_PROGRESS) -> dict:
        n = request.val.n_targets
        label = f"windows of {self.window}" + ("" if self.stride == 1 else f", one target in {self.stride}")
        with progress.phase(label, len(range(1, n + 1, self.stride)) * self.window) as tick:
            return score_contexts(request.model, request.val, self.window, self.contexts, self.stride,
                                  targets=self.keep_after is not None, tick=tick)


@dataclass(frozen=True)
class OnePass(StatefulPass):
    """One stream in chunks of ONE_PASS_CHUNK (scores.score_in_one_pass): every target from all before it."""
    kind: ClassVar[str] = "one_pass"
    label: ClassVar[str] = "whole context, one pass"

    @classmethod
    def plan(cls, model, n: int, keep: bool) -> "OnePass":
        return super().plan(model, n, ONE_PASS_CHUNK, 1, 0 if keep else None)


@dataclass(frozen=True)
class VocabularyPass(Pass):
    """The stateless table: one forward pass over the vocabulary gives every target from its previous token."""
    kind: ClassVar[str] = "vocabulary"

    def run(self, request, progress=NO_PROGRESS) -> dict:
        return {None: score_stateless(request.model, request.val)}


@dataclass(frozen=True)
class CountPass(Pass):
    """The bigram's counting of the training split: nothing runs through the model."""
    kind: ClassVar[str] = "count"

    def run(self, request, progress=NO_PROGRESS) -> dict:
        return {None: score_bigram(request.train_ids, request.val)}


def paired_targets(a: Pass, b: Pass, n: int) -> int:
    """How many targets a stateful figure's pass `a` (its warm ones) and a windowed figure's `b` both scored."""
    stride = math.lcm(*(p.stride if isinstance(p, WindowsPass) else 1 for p in (a, b)))
    if isinstance(a, StatefulPass):  # every a.stride-th stream
        return warm_targets(n, a.streams, a.stride, a.keep_after, stride)
    return len(congruent(1, n, 1, stride))
