"""When the report tells two figures apart: the one rule every finding calls (`difference`: between trainings,
paired by seed, else the within-run errors; docs/evaluation.md, *Findings*), and the line that says how many
trainings a finding rests on. Pairing by seed removes what two trainings share: their initial weights and batches.
"""

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from statistics import fmean, stdev

from gru_experiments.report.common import group_by

WORTH = 0.005  # bits per character: the least gain that makes the state worth carrying (the state-gain findings)

_used: ContextVar[list | None] = ContextVar("differences_used", default=None)


@dataclass(frozen=True)
class Difference:
    """a - b (or a against zero), its standard error, and what that error rests on."""

    value: float
    se: float
    trainings: tuple[int, int]  # trainings on each side (b's is 0 for a difference against zero)
    paired: bool  # paired by seed (the between-training rule over the seeds both sides share)
    worth: float = 0.0

    @property
    def over_seeds(self) -> bool:
        """Whether the standard error is the between-training one (two trainings or more a side)."""
        return min(n for n in self.trainings if n) >= 2

    @property
    def threshold(self) -> float:
        """How far from zero the difference must be to be shown: twice its standard error, at least `worth`."""
        return max(2 * self.se, self.worth)

    @property
    def below(self) -> bool:
        return self.value < -self.threshold

    @property
    def above(self) -> bool:
        return self.value > self.threshold

    @property
    def shown(self) -> bool:
        return self.below or self.above

    def text(self, digits: int = 4) -> str:
        """"+0.0123 ± 0.0040" (± one standard error)."""
        return f"{self.value:+.{digits}f} ± {self.se:.{digits}f}"


def side(item, figure) -> dict:
    """{seed: (value, se)} of each of `item`'s trainings (a setting's runs, or a single job) that has the figure;
    `figure(job)` gives (value, se) or None."""
    found = {}
    for i, run in enumerate(item.runs):
        got = figure(run)
        if got is not None and got[0] is not None:
            seed = run.values.get("seed")
            found[seed if seed is not None and seed not in found else f"run {i}"] = (got[0], got[1] or 0.0)
    return found


def summary_figure(key: str):
    """A `figure` for `side`: the summary's `key` and its standard error (`key`_se)."""
    return lambda job: (job.number(key), job.number(f"{key}_se") or 0.0)


def _mean_and_se(values: dict, over_seeds: bool) -> tuple[float, float]:
    """The mean over trainings and its standard error: between trainings (sd / sqrt n) over seeds, else from the
    within-run errors alone."""
    points, ses = zip(*values.values())
    se = stdev(points) / math.sqrt(len(points)) if over_seeds else math.sqrt(sum(se * se for se in ses)) / len(ses)
    return fmean(points), se


def difference(a: dict, b: dict | None = None, worth: float = 0.0) -> Difference | None:
    """a - b (b None: a against zero) by the report's one rule; None when a side has no training."""
    if not a or (b is not None and not b):
        return None
    n_a, n_b = len(a), (len(b) if b is not None else 0)
    shared = [seed for seed in a if b is not None and seed in b and not str(seed).startswith("run ")]
    over_seeds = n_a >= 2 and (b is None or n_b >= 2)
    if over_seeds and len(shared) >= 2:
        gaps = [a[seed][0] - b[seed][0] for seed in shared]
        found = Difference(fmean(gaps), stdev(gaps) / math.sqrt(len(gaps)), (len(shared), len(shared)), True, worth)
    else:
        mean_a, se_a = _mean_and_se(a, over_seeds)
        mean_b, se_b = _mean_and_se(b, over_seeds) if b is not None else (0.0, 0.0)
        found = Difference(mean_a - mean_b, math.hypot(se_a, se_b), (n_a, n_b), False, worth)
    if (used := _used.get()) is not None:
        used.append(found)
    return found


@contextmanager
def recording():
    """The differences computed inside the block (a finding's rule), for `rests_on`."""
    token = _used.set([])
    try:
        yield _used.get()
    finally:
        _used.reset(token)


def _count(ns) -> str:
    low, high = min(ns), max(ns)
    return f"{low}" if low == high else f"{low} to {high}"


def rests_on(used: list[Difference], jobs) -> str:
    """The sentence a finding ends with: how many trainings its comparisons (else its settings) rest on."""
    if used:
        over_seeds = [d for d in used if d.over_seeds]
        sizes = [n for d in over_seeds for n in d.trainings if n]
        if len(over_seeds) == len(used):
            paired = sum(d.paired for d in used)
            return (f"Rests on {_count(sizes)} trainings a side ({len(used)} comparisons; "
                    + (f"{paired} paired by seed; " if paired else "")
                    + "standard errors from the spread between trainings).")
        if not over_seeds:
            return ("Rests on one training each (the within-run standard errors, which say nothing of a second "
                    "training).")
        return (f"Rests on {_count(sizes)} trainings a side in {len(over_seeds)} of {len(used)} comparisons (the "
                f"spread between trainings) and one training on a side in {len(used) - len(over_seeds)} (its "
                "within-run standard errors, which say nothing of a second training).")
    ns = [len(job.runs) for job in jobs if getattr(job, "status", "completed") == "completed"]
    if not ns:
        return ""
    return ("Rests on one training each." if max(ns) == 1
            else f"Rests on {_count(ns)} trainings a setting (its means over seeds).")


# --- what several sections' findings compare ---------------------------------------------------------------
def state_gain(job) -> tuple[float, float] | None:
    """Stateful - windowed bits per character, paired target by target, and its se (the state-gain findings:
    report/findings.py, report/scale.py)."""
    gain, se = job.number("state_gain_bpc"), job.number("state_gain_se")
    return None if gain is None or se is None else (gain, se)


def at_two_sizes(jobs) -> dict[str, list]:
    """{tokenizer: its jobs, in their order} of each tokenizer whose jobs have two parameter counts or more."""
    groups = group_by(jobs, lambda job: job.values.get("tokenizer") or "?")
    return {kind: group for kind, group in groups.items() if len({job.number("parameters") for job in group}) > 1}


SAME_SIZE = 1.1  # two models are of one size when their parameter counts differ by at most this factor


def pairs_of_size(jobs, family: str, rival: str, alike=lambda job, other: True) -> list[tuple]:
    """(job, other) for each job of `family`: the job of family `rival`, of its tokenizer and `alike` it, nearest its
    size, where one is of its size (parameters within SAME_SIZE)."""
    pairs = []
    for job in (job for job in jobs if job.values.get("family") == family):
        size = job.number("parameters")
        near = [other for other in jobs if other.values.get("family") == rival and alike(job, other)
                and other.values.get("tokenizer") == job.values.get("tokenizer")
                and max(other.number("parameters"), size) <= SAME_SIZE * min(other.number("parameters"), size)]
        if near:
            pairs.append((job, min(near, key=lambda other: abs(other.number("parameters") - size))))
    return pairs
