"""report.md's *Dynamic evaluation* (each run's dynamic figure, study/dynamic.py, read from summary.json) and finding
22, *the weights read what the state does not*: per corpus, does dynamic evaluation gain over the stateful figure by
the report's one rule (significance.py), beside the cache's gain? The study's own figures (tuned on the first half,
reported on the second, by reach): tools/dynamic_study.py."""

from gru_experiments.report.cache import corpus
from gru_experiments.report.common import MISSING, cell, escape, group_by, table
from gru_experiments.report.section import Findings, Section, cannot, verdict
from gru_experiments.report.significance import WORTH, difference, side


def dynamic_gain(job) -> tuple[float, float] | None:
    """dynamic - stateful, paired target by target in the run's evaluation, and its se."""
    value, se = job.number("dynamic_gain_bpc"), job.number("dynamic_gain_se")
    return None if value is None or se is None else (value, se)


def cache_gain(job) -> tuple[float, float] | None:
    value, se = job.number("cache_gain_bpc"), job.number("cache_gain_se")
    return None if value is None or se is None else (value, se)


def _settings(job) -> str:
    s = (job.values.get("dynamic") or {}).get("settings") or {}
    if not s:
        return MISSING
    return (f"{s.get('rule')}, η {s.get('lr'):g}, λ {s.get('decay'):g}, segment {s.get('segment')}"
            + (f", reset {s['reset_every']}" if s.get("reset_every") else "")
            + ("" if s.get("params") in (None, "all") else f", {s['params']}"))


def dynamic_section(jobs, plots) -> list[str]:
    shown = [job for job in jobs if job.values.get("dynamic") is not None]
    if not shown:
        return []
    rows = []
    for job in shown:
        gain, cache = difference(side(job, dynamic_gain)), difference(side(job, cache_gain))
        diverged = (job.values.get("dynamic") or {}).get("diverged")
        rows.append([escape(job.name), escape(corpus(job)), str(job.n), cell(job.number("stateful_bpc"),
                     "{:.4f}".format), "diverged" if diverged else cell(job.number("dynamic_bpc"), "{:.4f}".format),
                     gain.text() if gain else MISSING, cache.text() if cache else MISSING, escape(_settings(job))])
    header = ["model", "corpus", "n", "stateful bpc", "dynamic bpc", "dynamic - stateful", "cache - model",
              "settings"]
    return ["## Dynamic evaluation", "",
            "Each run's dynamic figure (Krause et al. 2018): the validation split scored as the stateful pass lays it "
            "out, the weights stepping on each segment just scored and pulled back toward the trained ones "
            "(docs/evaluation.md, *Dynamic evaluation*). Dynamic - stateful is paired target by target (± one "
            "standard error by the report's rule: between trainings over seeds, else within the run); beside it the "
            "cache's gain over the model alone (on the split's second half). The study tuned on one half and "
            "reported on the other, by reach: `python tools/dynamic_study.py RUN ...`.", "",
            *table(header, rows, "lllr"), ""]


DYNAMIC = Findings("Findings on dynamic evaluation", "Whether the weights, adapted as they read, take what the "
                   "carried state leaves, judged per corpus (a gain counts when it is below zero by two standard "
                   f"errors and by at least {WORTH} bits per character).")


@DYNAMIC.claim("The weights read what the state does not")
def weights_finding(jobs) -> tuple[str, str]:
    """Does dynamic evaluation gain over the stateful figure, on every corpus, for the recurrent models?"""
    judged = [job for job in jobs if job.recurrent and dynamic_gain(job) is not None]
    if not judged:
        return cannot("a recurrent model's dynamic figure (every final evaluation has it: a run's summary.json "
                      "from before it lacks dynamic_gain_bpc)")
    parts, supported, against = [], 0, 0
    for name, group in group_by(judged, corpus).items():
        cases = []
        for job in group:
            gain = difference(side(job, dynamic_gain), worth=WORTH)
            cache = difference(side(job, cache_gain))
            supported += gain.below
            against += gain.above
            share = (f", {gain.value / cache.value:.0%} of the cache's {cache.text()}"
                     if cache is not None and cache.value < 0 else "")
            cases.append(f"{job.name} (n = {job.n}) {gain.text()}{share}")
        parts.append(f"on {name}, dynamic - stateful: " + ", ".join(cases))
    evidence = ("Dynamic - stateful bits per character in each run's evaluation (negative: adapting the weights to "
                "the text already read predicts the rest better than the carried state alone), ± one standard "
                "error: " + "; ".join(parts) + f". Below zero by the rule for {supported} of {len(judged)} models.")
    return verdict(supported, len(judged), against), evidence


FIGURES = ("dynamic_bpc", "dynamic_bpc_se", "dynamic_gain_bpc", "dynamic_gain_se")
SECTION = Section("dynamic evaluation", dynamic_section, findings=DYNAMIC,
                  columns={key: (lambda job, key=key: job.number(key)) for key in FIGURES})
