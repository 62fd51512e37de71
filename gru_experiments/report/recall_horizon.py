"""The planted-recall experiment's two tables after *Planted recall*: each probe run's memory horizon, and
what the recall costs the language model (each probe run beside its twin without the probe).
"""

from __future__ import annotations

import math

from gru_experiments.report.common import MISSING, figure_cell, table
from gru_experiments.report.context_classes import class_gain, class_record
from gru_experiments.report.recall_report import recall_jobs, recall_record, run_horizon
from gru_experiments.report.section import Section
from gru_experiments.study.generation import STATEFUL, WINDOWED

MODES = (STATEFUL, WINDOWED)  # stateless never remembers: its horizon is always none


def _remembered(h: dict) -> str:
    return MISSING if h["remembered"] is None else f"{h['remembered']:,}"


def _crossing(h: dict) -> str:
    if h["crosses_2_bits"] is not None:
        return f"{h['crosses_2_bits']:,.0f}"
    return "never" if h["crossing"].startswith("below") else "at once"


def _times_window(job, h: dict) -> str:
    window = job.training_window
    return MISSING if h["crosses_2_bits"] is None or not window else f"{h['crosses_2_bits'] / window:.1f}×"


def horizon_section(jobs, plots: dict) -> list[str]:
    """report.md's *Memory horizon* table ([] without a run with the probe)."""
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## Memory horizon", "",
             "How far each run keeps a key, in tokens: \"under 1 bit up to\", the longest distance up to which every "
             "recall costs under 1 bit; \"2 bits at\", where the recall curve first rises through 2 bits "
             "(interpolated linearly in log2 distance between the two validation distances around it; \"never\": "
             "under 2 bits at every distance, \"at once\": 2 bits or more at the shortest), and that distance over "
             "the training window. Past its window, the windowed mode cannot see the key.", ""]
    rows = [[f"{job.name}, {job.training}", str(job.training_window or MISSING), _remembered(stateful),
             _crossing(stateful), _times_window(job, stateful), _remembered(windowed), _crossing(windowed)]
            for job in shown for stateful, windowed in [[run_horizon(job, mode) for mode in MODES]]]
    header = ["run", "training window", "stateful: under 1 bit up to", "stateful: 2 bits at", "× training window",
              "windowed: under 1 bit up to", "windowed: 2 bits at"]
    return lines + table(header, rows, "lr") + [""]


# --- what learning the recall costs the language model ------------------------------------------------
def twin(job, jobs):
    """The completed job of the same model, training mode and window without the probe, None if none."""
    return next((other for other in jobs if other.status == "completed" and not recall_record(other)
                 and other.values.get("probe") in (None, "none") and other.name == job.name
                 and other.training_mode == job.training_mode and other.training_window == job.training_window),
                None)


def _cost(job, plain) -> str:
    """Stateful bits per character with the probe - without, ± the hypot of their standard errors."""
    a, b = job.number("stateful_bpc"), plain.number("stateful_bpc")
    if a is None or b is None:
        return MISSING
    se = math.hypot(job.number("stateful_bpc_se") or 0.0, plain.number("stateful_bpc_se") or 0.0)
    return f"{a - b:+.4f} ± {se:.4f}"


def most_helped_class(job) -> str:
    """The class of target where the state helps most (the lowest class state gain), with that gain."""
    gains = [(name, class_gain(job, name, "bpc"), class_gain(job, name, "se")) for name in class_record(job) or {}]
    gains = [g for g in gains if g[1] is not None]
    if not gains:
        return MISSING
    name, gain, se = min(gains, key=lambda g: g[1])
    return f"{name}: {gain:+.4f}" + ("" if se is None else f" ± {se:.4f}")


def cost_section(jobs, plots: dict) -> list[str]:
    """report.md's *What the recall costs* table ([] without a run with the probe)."""
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## What the recall costs the language model", "",
             "Each run with the probe beside its twin without it (same model, training mode and window), on the plain "
             "validation split: stateful bits per character ± se, the cost (with - without ± the two se's hypot), "
             "stateful - windowed ± its paired se (negative: carrying the state helps) and the kind of target where it "
             "helps most (the context curve by class: stateful - windowed on those targets).", ""]
    rows = []
    for job in shown:
        plain = twin(job, jobs)
        cells = ([figure_cell(plain, "stateful_bpc"), _cost(job, plain), figure_cell(job, "state_gain_bpc"),
                  figure_cell(plain, "state_gain_bpc"), most_helped_class(job), most_helped_class(plain)] if plain else
                 [MISSING, MISSING, figure_cell(job, "state_gain_bpc"), MISSING, most_helped_class(job), MISSING])
        rows.append([f"{job.name}, {job.training}", figure_cell(job, "stateful_bpc"), *cells])
    header = ["run", "stateful, with the probe", "without", "cost", "stateful - windowed, with", "without",
              "where the state helps most, with", "without"]
    return lines + table(header, rows, "lrrrrrll") + [""]


HORIZON, COST = Section("memory horizon", horizon_section), Section("what the recall costs", cost_section)
