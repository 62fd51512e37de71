"""Dynamic evaluation (study/dynamic.py) as a figure of a run's evaluation: its pass in the plan, priced at a
forward and BACKWARD_COST forward tokens a token (rms's statistics too), its entry in study/evaluation.ENTRIES, and
summary.json's record of it (docs/evaluation.md, *Dynamic evaluation*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gru_experiments.files import finite_or_null
from gru_experiments.study.dynamic import (
    BACKWARD_COST,
    DIVERGED,
    STATISTICS_STREAMS,
    DynamicScore,
    DynamicSettings,
    gradient_statistics,
    score_dynamic,
)
from gru_experiments.study.generation import NO_PROGRESS
from gru_experiments.study.modes import DYNAMIC, STATEFUL
from gru_experiments.study.plan import FINAL, OTHER, PRIORITY, Entry, Figure, Pass, Request, Unit
from gru_experiments.study.scores import Score, Split, chunks_cost, paired_difference, stream_layout, warm_targets


def statistics_forward(model, settings: DynamicSettings, train_tokens: int) -> int:
    """The forward tokens of rms's statistics (gradient_statistics's layout of its training tokens; 0 for sgd and
    lr = 0); its backward passes cost BACKWARD_COST times as much."""
    if settings.rule != "rms" or settings.lr == 0 or train_tokens < 2:
        return 0
    used = min(train_tokens, (settings.statistics or train_tokens) + 1)
    streams, length = stream_layout(used - 1, STATISTICS_STREAMS)
    return streams * chunks_cost(model, length, settings.segment)


@dataclass(frozen=True)
class DynamicPass(Pass):
    """The dynamic pass: `streams` streams in segments of `chunk` tokens, every stride-th stream (a sample)."""
    kind: ClassVar[str] = DYNAMIC
    chunk: int = 0
    streams: int = 1
    settings: DynamicSettings | None = None
    backward_tokens: int = 0  # of forward_tokens, the price of the backward passes and rms's statistics

    @classmethod
    def plan(cls, model, n: int, streams: int, settings: DynamicSettings, train_tokens: int,
             stride: int = 1) -> DynamicPass:
        streams, length = stream_layout(n, streams)
        rows = len(range(0, streams, stride))
        forward = rows * chunks_cost(model, length, settings.segment) + statistics_forward(model, settings,
                                                                                          train_tokens)
        backward = forward * BACKWARD_COST * (settings.lr > 0)
        targets = warm_targets(n, streams, stride, 0)
        return cls(targets, forward + backward, stride, None, settings.segment, streams, settings, backward)

    def run(self, request, progress=NO_PROGRESS) -> dict:
        model, s = request.model, self.settings
        statistics = None
        if s.rule == "rms" and s.lr > 0 and request.train_ids is not None:
            with progress.phase("dynamic: rms statistics on the training split",
                                statistics_forward(model, s, int(request.train_ids.numel()))):
                statistics = gradient_statistics(model, request.train_ids.to(model.device), s)
        label = DYNAMIC + ("" if self.stride == 1 else f", one stream in {self.stride}")
        with progress.phase(label, self.targets) as tick:
            return {None: score_dynamic(model, request.val, s, self.streams, stride=self.stride,
                                        statistics=statistics, tick=tick)}


class DynamicEntry(Entry):
    """The dynamic figure of a final evaluation (and of one that asks for it alone: purpose DYNAMIC), within the
    budget: every stream when it fits, else every stride-th (a sample, with its standard error); and dynamic −
    stateful, paired on the targets the stateful pass kept."""
    name = DYNAMIC
    reads_every_pass = True  # its gain pairs with the stateful pass's targets

    def units(self, request: Request) -> list[Unit]:
        if request.purpose not in (FINAL, DYNAMIC) or not request.model.trainable or self._too_short(request):
            return []
        s, n = request.settings, request.val.n_targets
        train = 0 if request.train_ids is None else len(request.train_ids)
        streams = stream_layout(n, s.streams)[0]
        return [Unit(lambda stride: [DynamicPass.plan(request.model, n, s.streams, s.dynamic, train, stride)],
                     lambda ps, i: [Figure(DYNAMIC, None, ps[0].forward_tokens // max(ps[0].targets, 1),
                                           ps[0].targets, ps[0].forward_tokens, (i,), OTHER)] if ps else [],
                     False, streams, optional=True, priority=PRIORITY[STATEFUL] + 5, owner=DYNAMIC)]

    def run(self, request: Request, plan, results: list[dict]) -> dict | None:
        figure = plan.figure(DYNAMIC)
        if figure is None:
            if request.purpose not in (FINAL, DYNAMIC) or not request.model.trainable:
                return None
            return {"note": self._too_short(request) or "left out: it did not fit evaluation.budget "
                                                        "(evaluation.budget=null scores it)"}
        result: DynamicScore = results[figure.passes[0]][None]
        stateful = results[plan.figure(STATEFUL).passes[0]].get(None)
        return dynamic_record(result, stateful, request.val)

    @staticmethod
    def _too_short(request: Request) -> str | None:
        """Why a run's evaluation has no dynamic figure: its split's streams shorter than a segment (a small corpus
        at the default segment), or rms without the training split its statistics come from; a note, the run intact
        (the API's own text is refused by score_dynamic in one line)."""
        s = request.settings
        length = stream_layout(request.val.n_targets, s.streams)[1]
        if request.purpose != FINAL:
            return None
        if s.dynamic.segment > length:
            return (f"not measured: the split's {s.streams} streams are {length:,} tokens each, shorter than "
                    f"evaluation.dynamic.segment={s.dynamic.segment}")
        if s.dynamic.rule == "rms" and s.dynamic.lr > 0 and request.train_ids is None:
            return "not measured: rule=rms gathers its statistics on the training split, which this evaluation lacks"
        return None

    def summary(self, record: dict | None) -> dict:
        return {"dynamic_bpc": record.get("bpc"), "dynamic_bpc_se": record.get("bpc_se"),
                "dynamic_gain_bpc": record.get("gain_bpc"), "dynamic_gain_se": record.get("gain_se"),
                "dynamic_diverged": record.get("diverged", False), "dynamic": record}

    def describe(self, r: dict) -> str:
        if r.get("bpc") is None:
            return f"dynamic: {r['note']}"
        s = r["settings"]
        gain = "" if r["gain_bpc"] is None else (f", dynamic - stateful {r['gain_bpc']:+.4f} ± {r['gain_se']:.4f} "
                                                 f"on {r['gain_targets']:,} targets")
        return (f"dynamic ({s['rule']}, η {s['lr']:g}, λ {s['decay']:g}, segment {s['segment']}, reset "
                f"{s['reset_every'] or 'never'}, {s['params']}; {r['updates']:,} updates over {r['streams']} "
                f"stream(s)): {r['bpc']:.4f} bits/char on {r['targets']:,} targets{gain}")


def dynamic_record(result: DynamicScore, stateful: Score | None, split: Split) -> dict:
    """summary.json's "dynamic": the figure, its settings, dynamic − stateful paired (on the targets the stateful
    pass kept: its warm ones; None when it kept none), or the divergence and no figure."""
    record = {"settings": result.settings.record(), "streams": result.streams, "stride": result.stride,
              "updates": result.updates}
    if result.diverged_at is not None:
        return record | {"bpc": None, "bpc_se": None, "gain_bpc": None, "gain_se": None, "diverged": True,
                         "note": f"diverged: a non-finite loss or weight, or a segment's loss over {DIVERGED} times "
                                 f"a uniform guess's, at token {result.diverged_at:,} of its streams; no figure (a "
                                 "smaller evaluation.dynamic.lr); every other figure is the trained weights' as ever"}
    score = result.score
    record |= {"bpc": score.bpc, "bpc_se": finite_or_null(score.sampling_se), "nll": score.nll,
               "nll_sum": score.nll_sum, "targets": score.tokens, "characters": score.characters,
               "gain_bpc": None, "gain_se": None, "gain_targets": 0, "diverged": False}
    if stateful is not None and stateful.positions is not None:
        gain = paired_difference(score, stateful, split)
        if gain.tokens:
            record |= {"gain_bpc": gain.bpc, "gain_se": finite_or_null(gain.bpc_se), "gain_targets": gain.tokens}
    return record
