"""report.md's *The cache* (each run's cache figure, study/cache.py, by N) and its findings, judged per corpus: is
there information past the training window that the model does not read (the cache's gain from positions past
the window against the carried state's, stateful - windowed), and does the carried state buy bits past the
window on a text where the cache shows there is some to buy."""

from gru_experiments.report.common import escape, group_by, plus_minus, table
from gru_experiments.report.section import Findings, Record, Section, cannot, verdict
from gru_experiments.report.significance import WORTH, Difference, difference, side, state_gain

cache_record = Record(("cache",), holding="by_size")


def corpus(job) -> str:
    return job.values.get("corpus") or "?"


def past_window(job) -> tuple[float, float] | None:
    """The cache at its longest N - the cache at N = the training window, paired, and its se."""
    past, se = job.number("cache_past_window_bpc"), job.number("cache_past_window_se")
    return None if past is None or se is None else (past, se)


def gain_of(job, figure, less=None) -> Difference | None:
    """The figure (past_window, state_gain) of each of the job's trainings, less `less`'s where given, by the
    report's rule (significance.py): it counts as a gain when `.below` zero by two standard errors and by at least
    WORTH bits per character."""
    return difference(side(job, figure), None if less is None else side(job, less), worth=WORTH)


def cache_section(jobs, plots) -> list[str]:
    shown = cache_record.jobs(jobs)
    if not shown:
        return []
    sizes = sorted({int(n) for job in shown for n in cache_record(job)["by_size"]})
    rows = []
    for job in shown:
        record = cache_record(job)
        by_size = record["by_size"]
        cells = [plus_minus(by_size[str(n)]["gain_bpc"], by_size[str(n)]["gain_se"], 4, "+") if str(n) in by_size
                 else "—" for n in sizes]
        gain = state_gain(job)
        rows.append([escape(job.model), escape(corpus(job)), record["kind"], f"{record['model_bpc']:.4f}", *cells,
                     plus_minus(job.number("cache_past_window_bpc"), job.number("cache_past_window_se"), 4, "+"),
                     plus_minus(*gain, 4, "+") if gain else "—"])
    header = ["model", "corpus", "cache", "model alone", *(f"N = {n}" for n in sizes), "past the window",
              "stateful - windowed"]
    return ["## The cache", "",
            "Each model's stateful distribution interpolated with a cache over its own last N tokens (the continuous "
            "cache over its final hidden states, Grave et al. 2017; the count cache for a counted model), λ and θ "
            "fitted on the first half of the validation split: bits per character on its second half, the cache "
            "minus the model alone, paired target by target (± one standard error; negative: the cache helps). Past "
            "the window: the cache at its longest N minus the cache at N = the training window, paired; beside it "
            "the carried state's own gain past the window (stateful - windowed). docs/evaluation.md, *The cache*.",
            "", *table(header, rows, "lllr"), ""]


CACHE = Findings("Findings on the cache", "What a cache over each model's own past shows of the text past the "
                 "training window, judged per corpus (bits per character, ± one standard error; a gain counts when "
                 f"it is below zero by two standard errors and by at least {WORTH} bits per character).")


@CACHE.claim("The text holds information past the window that the model does not read")
def unread_finding(jobs) -> tuple[str, str]:
    """Does the cache gain from positions past the window, beyond what the carried state gains there?"""
    judged = [job for job in jobs if past_window(job) is not None and state_gain(job) is not None]
    if not judged:
        return cannot("no model with both the cache's figure past the window and stateful - windowed")
    parts, supported, contradicted = [], 0, 0
    for name, group in group_by(judged, corpus).items():
        cases = []
        for job in group:
            past, carried = gain_of(job, past_window), gain_of(job, state_gain)
            unread = gain_of(job, past_window, less=state_gain)
            if past.below and unread.below:
                supported += 1
            elif not past.below:
                contradicted += 1
            cases.append(f"{job.model}: cache past the window {past.text()}, carried state {carried.text()}, "
                         f"unread {unread.text()}")
        parts.append(f"on {name}, " + "; ".join(cases))
    evidence = ("The cache's gain from the positions past the training window (the cache at its longest N - at N = "
                "the window) against the carried state's gain past it (stateful - windowed), their difference the "
                "information the model leaves unread: " + "; ".join(parts) + f". Supported for {supported} of "
                f"{len(judged)} models (the cache gains past the window, and more than the state).")
    return verdict(supported, len(judged), contradicted), evidence


@CACHE.claim("On text with long-range structure the carried state buys bits past the window")
def long_range_finding(jobs) -> tuple[str, str]:
    """On the corpora where the cache finds information past the window, is stateful - windowed below zero?"""
    measured = [job for job in jobs if past_window(job) is not None]
    if not measured:
        return cannot("no model with the cache's figure past the window (what shows a corpus's long-range "
                      "structure)")
    groups = group_by(measured, corpus)
    structured = {name: group for name, group in groups.items()
                  if any(gain_of(job, past_window).below for job in group)}
    others = ", ".join(name for name in groups if name not in structured)
    if not structured:
        return cannot(f"a corpus whose long-range structure the cache shows (none of {', '.join(groups)})")
    judged = [job for group in structured.values() for job in group if state_gain(job) is not None]
    if not judged:
        return cannot(f"stateful - windowed on {', '.join(structured)}")
    parts, bought = [], 0
    for name, group in structured.items():
        cases = []
        for job in (job for job in group if state_gain(job) is not None):
            carried = gain_of(job, state_gain)
            bought += carried.below
            cases.append(f"{job.model} {carried.text()}")
        parts.append(f"On {name}, stateful - windowed: " + ", ".join(cases))
    evidence = ("Text with long-range structure: a corpus on which some model's cache gains from positions past "
                f"the window ({', '.join(structured)}" + (f"; not {others}" if others else "") + "). "
                + "; ".join(parts) + f". The carried state buys bits past the window for {bought} of {len(judged)} "
                "models there.")
    return verdict(bought, len(judged), len(judged) - bought), evidence


FIGURES = ("cache_size", "cache_gain_bpc", "cache_gain_se", "cache_past_window_bpc", "cache_past_window_se")
SECTION = Section("cache", cache_section, findings=CACHE, columns={
    "corpus": lambda job: job.values.get("corpus"), **{key: (lambda job, key=key: job.number(key)) for key in FIGURES}})
