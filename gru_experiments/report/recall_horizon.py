"""The planted-recall control's horizons (report/recall.py reads the record): each probe run's memory horizon, and
the LSTM's memory against the GRU's, the original study's Leviathan claim (the runs: experiment=recall_lstm_*,
docs/results.md#the-planted-recall-control).
"""

import math

from gru_experiments.report.common import MISSING, table
from gru_experiments.report.recall import (
    beats_chance,
    changes,
    crossing_text,
    distances,
    no_memory,
    recall_jobs,
    remembered_text,
    run_horizon,
)
from gru_experiments.report.section import Findings, Section, cannot, verdict
from gru_experiments.report.significance import pairs_of_size
from gru_experiments.study.modes import STATEFUL, WINDOWED


# --- the memory horizon -------------------------------------------------------------------------------------
def _horizon(job, h: dict) -> list[str]:
    """A horizon's cells (stateful's or windowed's; stateless never remembers): under 1 bit up to, 2 bits at and
    that over the training window."""
    crossing, window = h["crosses_2_bits"], job.training_window
    return [MISSING if h["remembered"] is None else remembered_text(h), crossing_text(h),
            MISSING if crossing is None or not window else f"{crossing / window:.1f}×"]


def horizon_section(jobs, plots: dict) -> list[str]:
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## Memory horizon", "",
             "How far each run keeps a key, in tokens: \"under 1 bit up to\", the longest distance up to which every "
             "recall costs under 1 bit; \"2 bits at\", where the recall curve first rises through 2 bits "
             "(interpolated linearly in log2 distance between the two validation distances around it; \"never\": "
             "under 2 bits at every distance, \"at once\": 2 bits or more at the shortest), and that distance over "
             "the training window. Past its window, the windowed mode cannot see the key.", ""]
    rows = [[f"{job.name}, {job.training}", str(job.training_window or MISSING),
             *_horizon(job, run_horizon(job, STATEFUL)), *_horizon(job, run_horizon(job, WINDOWED))[:2]]
            for job in shown]
    header = ["run", "training window", "stateful: under 1 bit up to", "stateful: 2 bits at", "× training window",
              "windowed: under 1 bit up to", "windowed: 2 bits at"]
    return lines + table(header, rows, "lr") + [""]


HORIZON = Section("memory horizon", horizon_section)


# --- the LSTM's memory against the GRU's --------------------------------------------------------------------
LSTM_MEMORY = Findings("Findings on the LSTM's memory", "The original study's Leviathan claim, that an LSTM's cell "
                       "state keeps long-range dependencies better than a GRU, put to the planted-recall control at "
                       "equal size: a hand-written LSTM beside the GRU of its size, trained alike "
                       "(experiment=recall_lstm_*).")


def lstm_pairs(jobs) -> list[tuple]:
    """(LSTM, GRU) recall runs of one size (significance.pairs_of_size), tokenizer, training mode and window:
    each LSTM with the GRU nearest its size; ordered by size, then training."""
    runs = [job for job in recall_jobs(jobs) if job.number("parameters") and distances(job)]
    pairs = pairs_of_size(runs, "lstm", "gru", lambda lstm, gru: (gru.training_mode, gru.training_window)
                          == (lstm.training_mode, lstm.training_window))
    return sorted(pairs, key=lambda pair: (pair[1].number("parameters"), pair[0].training))


def _reach(h: dict) -> tuple:
    """A horizon's reach, to compare two: where it rises through 2 bits (inf: never, 0: at once), then under 1 bit."""
    crossing = h["crosses_2_bits"]
    return (crossing if crossing is not None else math.inf if h["crossing"].startswith("below") else 0.0,
            h["remembered"] or 0)


def _horizon_text(h: dict) -> str:
    return f"under 1 bit up to d = {remembered_text(h)}, 2 bits at {crossing_text(h, 'd ≈ ')}"


def _lstm_part(lstm, gru) -> tuple[int, str]:
    """(+1 the LSTM keeps the key longer, -1 shorter, 0 no difference shown; the evidence) of one pair."""
    hl, hg = run_horizon(lstm, STATEFUL), run_horizon(gru, STATEFUL)
    longer, shorter = _reach(hl) > _reach(hg), _reach(hl) < _reach(hg)
    # only where one of the two recalls (beats log2 K by two se's): where both are at chance or below it (a model
    # confidently wrong), neither remembers, and which pays more says nothing of memory
    found = [(d, change) for d, _, _, change in changes(lstm, gru)
             if no_memory(lstm) is None or beats_chance(lstm, d) or beats_chance(gru, d)]
    better, worse = sum(c.below for _, c in found), sum(c.above for _, c in found)
    parts = [f"d = {d}: {c.text(3)}" for d, c in found]
    outcome = 1 if longer and better and not worse else -1 if shorter and worse and not better else 0
    text = (f"{lstm.name} ({lstm.number('parameters'):,.0f} parameters) against {gru.name} "
            f"({gru.number('parameters'):,.0f}), trained on {lstm.training}: stateful horizon LSTM "
            f"{_horizon_text(hl)}, GRU {_horizon_text(hg)}; LSTM - GRU bits per recalled key "
            + ("; ".join(parts) or "at no common distance")
            + f" (LSTM better by two standard errors at {better}, worse at {worse}): "
            + {1: "the LSTM keeps it longer", -1: "the GRU keeps it longer", 0: "no difference shown"}[outcome])
    return outcome, text


@LSTM_MEMORY.claim("An LSTM keeps a key longer than a GRU of the same size")
def lstm_longer_finding(jobs) -> tuple[str, str]:
    """Per pair of equal size and training: is the LSTM's stateful horizon longer, and its recall better than
    the GRU's by two standard errors at some distance and worse at none?"""
    pairs = lstm_pairs(jobs)
    if not pairs:
        return cannot("an LSTM and a GRU of the same size, tokenizer and training, both run with the probe "
                      "(python sweep.py experiments=recall_horizon probe=recall,none)")
    results = [_lstm_part(lstm, gru) for lstm, gru in pairs]
    longer, shorter = sum(o == 1 for o, _ in results), sum(o == -1 for o, _ in results)
    evidence = ("Stateful recall, bits per recalled key, LSTM - GRU ± the hypot of their standard errors (over "
                "seeds: the spread between trainings), and each run's memory horizon: "
                + "; ".join(t for _, t in results) + ". Rule: the LSTM keeps a key longer in a pair when its "
                "horizon is longer (2 bits crossed later, else under 1 bit further) and its "
                "recall is below the GRU's by more than two standard errors of the difference at some distance and "
                "above it at none (and the other way round for the GRU), at the distances where one of the two "
                f"recalls (below log2 K by two standard errors). The LSTM longer in {longer} of "
                f"{len(pairs)} pairs, the GRU in {shorter}.")
    return verdict(longer, len(pairs), shorter), evidence


LSTM = Section("the LSTM's memory", lambda jobs, plots: [], findings=LSTM_MEMORY)
