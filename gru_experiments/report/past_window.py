"""report.md's *Past the window* (`python sweep.py experiments=past_window seeds=3`): trainings whose gradient reaches
past the windowed mode's context (streams with a long BPTT, long windows) beside their baselines, per corpus, and
its finding: does a gradient path past the window teach the state to read past it? Every figure is of a setting
(its means over seeds, seed_groups.py) and every comparison goes through significance.py."""

from gru_experiments.report.cache import corpus, past_window
from gru_experiments.report.common import MISSING, cell, escape, group_by, table
from gru_experiments.report.section import Findings, Section, cannot
from gru_experiments.report.significance import WORTH, difference, side, state_gain
from gru_experiments.study.cost import duration
from gru_experiments.study.evaluation import curve_points


def window(job) -> int | None:
    """The windowed mode's context (summary.json's mode_evaluation.window)."""
    value = (job.values.get("mode_evaluation") or {}).get("window")
    return value if isinstance(value, int) else None


def studied(jobs) -> list:
    """The completed settings trained past their windowed context, or beside such a training on their corpus."""
    done = [job for job in jobs if job.status == "completed" and state_gain(job) is not None and window(job)]
    past = {corpus(job) for job in done if (job.training_window or 0) > window(job)}
    return [job for job in done if corpus(job) in past]


def own_length_gain(job) -> float | None:
    """Stateful - the context curve at the training's own length (unpaired: the curve point is a sample)."""
    points = dict(curve_points(job.values.get("context_curve")))
    at = points.get(str(job.training_window))
    stateful = job.number("stateful_bpc")
    return None if at is None or stateful is None or (job.training_window or 0) <= window(job) else stateful - at


def past_window_section(jobs, plots) -> list[str]:
    shown = studied(jobs)
    if not shown:
        return []
    rows = []
    for job in shown:
        carried, cache = difference(side(job, state_gain)), difference(side(job, past_window))
        rows.append([escape(job.name), escape(job.training), escape(corpus(job)), str(job.n),
                     cell(job.number("stateful_bpc"), "{:.4f}".format), carried.text(),
                     cell(own_length_gain(job), "{:+.4f}".format), cache.text() if cache else MISSING,
                     cell(job.number("train_seconds"), duration)])
    header = ["model", "training", "corpus", "n", "stateful bpc", f"stateful - windowed ({window(shown[0])})",
              "stateful - curve at its training length", "cache past the window", "training time"]
    return ["## Past the window", "",
            "Trainings whose gradient reaches past the windowed mode's context beside their baselines (a setting's "
            "means over its n trainings; ± one standard error by the report's rule: between trainings over seeds, "
            "else within the run). Stateful - windowed is paired target by target; negative where the carried state "
            "reads what the window cannot. The cache past the window: what a cache over the model's own last 4,096 "
            "positions still finds there (docs/evaluation.md, *The cache*).", "", *table(header, rows, "lllr"), ""]


PAST_WINDOW = Findings("Findings past the window", "Whether a training that sends the gradient past the window "
                       "teaches the carried state to read past it, per corpus (a gain counts when it is below zero by "
                       f"two standard errors and by at least {WORTH} bits per character).")


@PAST_WINDOW.claim("A gradient path past the window teaches the state to read past it")
def past_window_finding(jobs) -> tuple[str, str]:
    """Does some recurrent training reach stateful - windowed below -WORTH, shown over seeds?"""
    shown = studied(jobs)
    recurrent = [job for job in shown if job.recurrent and (job.training_window or 0) > window(job)]
    if not recurrent:
        scored = [job for job in jobs if job.recurrent and window(job) and job.training_window]
        longest = max(scored, key=lambda job: job.training_window, default=None)
        return cannot("a recurrent model trained past its windowed context (python sweep.py experiments=past_window "
                      "seeds=3)" + ("" if longest is None else f"; the longest training window here, "
                                    f"{longest.training_window}, is within the windowed mode's {window(longest)} "
                                    "(a smoke run trains on windows of 32: add evaluation.window=16)"))
    parts, over_seeds, single = [], 0, 0
    for name, group in group_by(shown, corpus).items():
        gains = {id(job): difference(side(job, state_gain), worth=WORTH) for job in group}
        trained_past = [job for job in group if job in recurrent]
        if not trained_past:
            continue
        best = min(trained_past, key=lambda job: gains[id(job)].value)
        found = gains[id(best)]
        over_seeds += found.below and found.over_seeds
        single += found.below and not found.over_seeds
        cache = difference(side(best, past_window))
        recovered = (f", {found.value / cache.value:.0%} of the cache's {cache.text()} past the window"
                     if cache is not None and cache.value < 0 else "")
        controls = [f"{job.name} ({job.training}) {gains[id(job)].text()}" for job in group if not job.recurrent]
        parts.append(f"on {name}, the best recurrent training past the window is {best.name} ({best.training}, "
                     f"n = {best.n}): stateful - windowed {found.text()}{recovered}" + _beyond_streams(best, group)
                     + (f"; the control, {', '.join(controls)}" if controls else ""))
    verdict = ("supported" if over_seeds else "partly supported" if single else "not shown by this sweep")
    evidence = ("Stateful - windowed bits per character (negative: the state reads past the window), ± one standard "
                "error: " + "; ".join(parts) + ". Supported when a recurrent training is below zero by the rule over "
                "seeds; one training alone makes it partly supported. A control below zero shows the bits past the "
                "window can be learned at this size.")
    return verdict, evidence


def _beyond_streams(best, group) -> str:
    """What the longer gradient path adds to carrying the state: the best training against the same model on streams
    whose gradient stops at the window (its own gain is the state's, with no gradient past the window)."""
    baseline = next((job for job in group if job.name == best.name and job.training_mode == "streams"
                     and job.training_window == window(job) and job is not best), None)
    if baseline is None:
        return ""
    own, beyond = difference(side(baseline, state_gain), worth=WORTH), difference(side(best, state_gain),
                                                                                   side(baseline, state_gain), WORTH)
    return (f"; on streams with the gradient cut at the window ({baseline.training}, n = {baseline.n}) the state "
            f"gains {own.text()} by itself, so the longer path adds {beyond.text()} "
            f"({'shown' if beyond.below else 'not shown'})")


SECTION = Section("past the window", past_window_section, findings=PAST_WINDOW)
