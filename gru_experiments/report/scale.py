"""The study at scale (report.md's *Scale*, `scale_context_curve.png`, its claim below): the recurrent models of a
sweep at two sizes or more (`python sweep.py experiments=scale`) by parameter count. The state's gain here is
windowed - stateful (summary.json's `state_gain_bpc` negated: positive where the carried state helps).
"""

import math
from pathlib import Path

from gru_experiments.report import significance
from gru_experiments.report.common import MISSING, cell, escape, figure_cell, image, table
from gru_experiments.report.plots import save_curves
from gru_experiments.report.section import Findings, Section, cannot, verdict
from gru_experiments.report.significance import WORTH, difference, side
from gru_experiments.study.cost import duration
from gru_experiments.study.evaluation import curve_points
from gru_experiments.study.modes import MODES_BY_CONTEXT
from gru_experiments.study.plan import BIGRAM

PLOT_SCALE = "scale_context_curve.png"
COLUMNS = (*MODES_BY_CONTEXT, BIGRAM)  # the table's bpc columns: the inference modes, then the bigram baseline


def scale_jobs(jobs) -> list:
    """The completed recurrent models trained on windows without a probe, ordered by tokenizer and size, when
    one tokenizer has them at two sizes or more; [] otherwise."""
    judged = [job for job in jobs if job.status == "completed" and job.recurrent
              and job.training_mode == "windows" and job.values.get("probe") in (None, "none")
              and job.number("parameters") and job.number("stateful_bpc") is not None]
    if not significance.at_two_sizes(judged):
        return []
    return sorted(judged, key=lambda job: (job.values.get("tokenizer") or "?", job.number("parameters")))


def state_gain(job) -> tuple[float, float] | None:
    """What the carried state buys over the training window: windowed - stateful bits per character, ± se."""
    found = significance.state_gain(job)
    return None if found is None else (-found[0], found[1])


def chars_per_token(job) -> float:
    """Characters per token of the validation text, from the stateful figure in nats/token and bits/char."""
    nll, bpc = job.number("stateful_nll"), job.number("stateful_bpc")
    return 1.0 if not nll or not bpc else nll / math.log(2) / bpc


def label(job) -> str:
    """The model's name and variant, without its steps (the section says them beside it)."""
    return f"{job.name} ({job.variant})" if job.variant else job.name


def steps(job) -> str:
    """"2,000 of 8,000": the steps trained and the recipe's, where known."""
    trained, recipe = job.number("train_steps"), job.number("recipe_steps")
    return MISSING if trained is None else f"{trained:,.0f}" + ("" if recipe is None else f" of {recipe:,.0f}")


def _best(job) -> str:
    best, step = job.best("val_bpc"), job.best("step")
    return MISSING if best is None else f"{best:.4f} at step {step:,.0f}, final {job.number('val_bpc'):.4f}"


def scale_section(jobs, plots: dict[str, Path]) -> list[str]:
    chosen = scale_jobs(jobs)
    if not chosen:
        return []
    rows = [[escape(label(job)), job.values.get("tokenizer") or "?", f"{job.number('parameters'):,.0f}", steps(job),
             *(figure_cell(job, f"{mode}_bpc") for mode in COLUMNS),
             cell(state_gain(job),
                  lambda gain: f"{gain[0]:+.5f} ± {gain[1]:.5f} ({job.training_window or '?'} tokens)"),
             _best(job), cell(job.number("train_seconds"), duration)] for job in chosen]
    header = ["model", "tokens", "parameters", "steps", *(f"{mode} bpc" for mode in COLUMNS),
              "state's gain over the window", "val bpc: best, final", "training time"]
    return ["## Scale: the models by size", "",
            "The recurrent models of this sweep by size, each trained for the steps shown (of its recipe's). Bits per "
            "character of the final weights ± one standard error; the state's gain over the window is windowed - "
            "stateful, paired target by target (positive where the carried state beats the last training window's "
            "tokens from a zero state). The figure puts every context curve on one axis of characters (a subword "
            "model's tokens times its characters per token).", "",
            *table(header, rows, "llrl" + "r" * 7), "",
            image("bits per character against the characters of context, every size", PLOT_SCALE, plots,
                  "no context curve."), ""]


def plot_scale_curves(jobs, path: Path) -> Path | None:
    """One curve per model against the characters of context (log axis), its stateful figure at the right."""
    chosen = [job for job in scale_jobs(jobs) if curve_points(job.values.get("context_curve"))]
    if not chosen:
        return None
    curves = {f"{label(job)} ({job.number('parameters') / 1e6:.2f}M, {job.values.get('tokenizer')})":
              ([(int(key) * chars_per_token(job), value) for key, value in curve_points(job.values["context_curve"])
                if key.isdigit()], job.number("stateful_bpc")) for job in chosen}
    return save_curves(path, curves, "Bits per character against the context given, by size (final weights)",
                       "characters of context (from the initial state); right: the state carried (stateful)")


SCALE = Findings("Findings at scale", "What capacity changes, judged on this sweep's recurrent models of two "
                 "sizes or more of one tokenizer (final weights).")


@SCALE.claim("The carried state's gain grows with capacity")
def state_gain_grows_finding(jobs) -> tuple[str, str]:
    """Per tokenizer: does the largest model take more from a state older than its window than the smallest
    does, by two standard errors of the difference and by at least WORTH (significance.difference)?"""
    chosen = [job for job in scale_jobs(jobs) if state_gain(job) is not None]
    groups = significance.at_two_sizes(chosen)
    if not groups:
        return cannot("recurrent models of one tokenizer at two sizes with the paired stateful - windowed figure "
                      "(python sweep.py experiments=scale)")
    parts, grows = [], 0
    for kind, group in groups.items():
        small, large = group[0], group[-1]
        change = difference(side(large, state_gain), side(small, state_gain), worth=WORTH)
        grows += change.above
        sizes = ", ".join(f"{label(job)} ({job.number('parameters'):,.0f} parameters, {steps(job)} steps) "
                          f"{difference(side(job, state_gain)).text(5)}" for job in group)
        significant = difference(side(large, state_gain), worth=WORTH).above
        parts.append(f"{kind}: {sizes}; largest - smallest {change.text(5)} "
                     f"({'grows' if change.above else 'does not grow'}; the largest "
                     f"{'takes' if significant else 'takes nothing worth carrying'} from a state older than its "
                     f"window)")
    evidence = ("Windowed - stateful bits per character (what the state carried beyond the training window buys), "
                "± one standard error (paired by target within a run; between trainings over seeds): "
                + "; ".join(parts) + f". It grows, by two standard errors and at least {WORTH} bits per character, "
                f"for {grows} of {len(groups)} tokenizers.")
    return (verdict(grows, len(groups)), evidence)


SECTION = Section("scale", scale_section, plots={PLOT_SCALE: plot_scale_curves}, findings=SCALE)
