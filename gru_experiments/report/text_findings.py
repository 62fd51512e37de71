"""The findings on the generated text (summary.json's "text", history.csv's word validity over training),
each judged by the numbers of one sweep (report.md's *Findings on the generated text*):

    greedy decoding loops whatever the mode
    stateless text is noise
    stateful text keeps the corpus's line shape
    stateful text at the first validation beats stateless text at the last (the seed's lesson 3)
    a large model copies its training text

Every figure is a mean over the samples of a setting ± one standard error (study/text_stats.py);
a difference of two figures has the standard error hypot(se1, se2). A job is anything with `.model`,
`.values` (its summary.json) and `.history` ({metric: [(step, value), ...]}), as sweep_folder.JobResult.
"""

from __future__ import annotations

import math

from gru_experiments.report.finding import RECURRENT, Finding, cannot, finite, plus_minus, verdict
from gru_experiments.report.text_report import SEED_DECODER, bound, setting, text_jobs

TEXT_CLAIMS = (
    "Greedy decoding loops whatever the mode",
    "Stateless text is noise",
    "Stateful text keeps the corpus's line shape",
    "Stateful text at the first validation beats stateless text at the last",
    "A large model copies its training text",
)
LOOPING = 0.5  # greedy "loops" when at least this share of its samples end in a repeated phrase
LINE_SLACK = 0.05  # KS distance: how far above the reference's own line_shape still counts as the corpus's shape
LARGE = 1_000_000  # parameters: the least for "a large model"
NO_TEXT = "no completed job with the text statistics (summary.json's text)"


def _se(*figures) -> float:
    """The standard error of a difference of figures (value, se): hypot of theirs (a missing one: 0)."""
    return math.hypot(*((figure[1] or 0.0) for figure in figures))


def _fig(figure) -> str:
    return plus_minus(*figure)


def greedy_loop_finding(jobs) -> Finding:
    """Does greedy decoding end in a loop in every inference mode (loop_rate >= LOOPING)?"""
    claim = TEXT_CLAIMS[0]
    parts, looping, judged = [], 0, 0
    for job in text_jobs(jobs):
        rates = {mode: figure for mode in ("stateful", "windowed", "stateless")
                 if (figure := setting(job, mode, "greedy", "loop_rate")) is not None}
        if not rates:
            continue
        judged += len(rates)
        looping += sum(figure[0] >= LOOPING for figure in rates.values())
        reference = bound(job, "reference", "loop_rate")
        parts.append(f"{job.model}: " + ", ".join(f"{mode} {_fig(figure)}" for mode, figure in rates.items())
                     + (f" (reference {_fig(reference)})" if reference else ""))
    if not judged:
        return cannot(claim, NO_TEXT + " and greedy samples")
    evidence = ("Greedy decoding's loop_rate (the share of samples ending in a repeated phrase): " + "; ".join(parts)
                + f". Rule: greedy loops in a mode when its loop_rate is at least {LOOPING}; supported when it does in "
                f"every mode of every model. It does in {looping} of {judged} (model, mode) settings.")
    return Finding(claim, verdict(looping, judged), evidence)


def stateless_noise_finding(jobs) -> Finding:
    """Are stateless samples' words far rarer in the corpus than stateful samples' and the reference's?"""
    claim = TEXT_CLAIMS[1]
    parts, noise, judged = [], 0, 0
    for job in text_jobs(jobs):
        stateless, stateful = (setting(job, mode, SEED_DECODER, "word_validity") for mode in ("stateless", "stateful"))
        reference = bound(job, "reference", "word_validity")
        if stateless is None or stateful is None or reference is None:
            continue
        judged += 1
        gaps = [(other[0] - stateless[0], _se(other, stateless)) for other in (stateful, reference)]
        noise += all(gap > 2 * se for gap, se in gaps)
        floor = bound(job, "floor", "word_validity")
        parts.append(f"{job.model}: stateless {_fig(stateless)}, stateful {_fig(stateful)} (gap {gaps[0][0]:+.3f} ± "
                     f"{gaps[0][1]:.3f}), reference {_fig(reference)} (gap {gaps[1][0]:+.3f} ± {gaps[1][1]:.3f})"
                     + (f", random floor {floor[0]:.3f}" if floor else ""))
    if not judged:
        return cannot(claim, NO_TEXT + " and the stateless, stateful and reference word_validity")
    evidence = (f"word_validity (the share of a sample's words found in the training split), decoder {SEED_DECODER}: "
                + "; ".join(parts) + ". Rule: supported for a model when stateless is below both stateful and the "
                f"reference by more than two standard errors of the difference (hypot of the two). It is for {noise} "
                f"of {judged} models.")
    return Finding(claim, verdict(noise, judged), evidence)


def line_shape_finding(jobs) -> Finding:
    """Is stateful text's line-length distribution as close to the corpus's as held-out text is?"""
    claim = TEXT_CLAIMS[2]
    parts, kept, judged = [], 0, 0
    for job in text_jobs(jobs):
        stateful, reference = setting(job, "stateful", SEED_DECODER, "line_shape"), bound(job, "reference",
                                                                                           "line_shape")
        if stateful is None or reference is None:
            continue
        judged += 1
        limit = reference[0] + LINE_SLACK + 2 * _se(stateful, reference)
        kept += stateful[0] <= limit
        part = (f"{job.model}: stateful {_fig(stateful)} against the reference's {_fig(reference)} (limit "
                f"{limit:.3f}: {'within' if stateful[0] <= limit else 'beyond'})")
        stateless = setting(job, "stateless", SEED_DECODER, "line_shape")
        if stateless is not None:
            part += f", stateless {_fig(stateless)} ({'within' if stateless[0] <= limit else 'beyond'})"
        parts.append(part)
    if not judged:
        return cannot(claim, NO_TEXT + " and the stateful and reference line_shape")
    evidence = (f"line_shape (the Kolmogorov–Smirnov distance of the samples' line lengths from the reference's; the "
                f"reference's own: against other validation slices), decoder {SEED_DECODER}: " + "; ".join(parts)
                + f". Rule: supported for a model when stateful's is at most the reference's + {LINE_SLACK} + two "
                f"standard errors of the difference. It is for {kept} of {judged} models.")
    return Finding(claim, verdict(kept, judged), evidence)


def _first_last(job) -> tuple | None:
    stateful = job.history.get("val/stateful_word_validity") or []
    stateless = job.history.get("val/stateless_word_validity") or []
    if not stateful or not stateless or finite(stateful[0][1]) is None or finite(stateless[-1][1]) is None:
        return None
    return stateful[0], stateless[-1]


def early_stateful_finding(jobs) -> Finding:
    """(The seed's lesson 3, in words.) Does the stateful text of the first validation have more valid words
    than the stateless text of the last?"""
    claim = TEXT_CLAIMS[3]
    judged = [(job, pair) for job in jobs if (job.values.get("family") or "gru") in RECURRENT
              and getattr(job, "history", None) and (pair := _first_last(job)) is not None]
    if not judged:
        return cannot(claim, "history.csv's val/stateful_word_validity and val/stateless_word_validity for a "
                             "recurrent model")
    early = sum(first[1] > last[1] for _, (first, last) in judged)
    parts = [f"{job.model} {first[1]:.3f} at step {first[0]} vs {last[1]:.3f} at step {last[0]}"
             for job, (first, last) in judged]
    evidence = ("word_validity of a short sample at every validation (history.csv), stateful at the first against "
                "stateless at the last: " + "; ".join(parts) + f". Rule: supported for a model when the first "
                f"stateful figure is the higher (one sample each: no standard error). It is for {early} of "
                f"{len(judged)} recurrent models.")
    return Finding(claim, verdict(early, len(judged)), evidence)


def copying_finding(jobs) -> Finding:
    """Does the sweep's largest model (at least LARGE parameters) reproduce 32-character spans of its training
    text more often than held-out text happens to?"""
    claim = TEXT_CLAIMS[4]
    judged = [job for job in text_jobs(jobs) if (finite(job.values.get("parameters")) or 0) >= LARGE
              and setting(job, "stateful", SEED_DECODER, "copy_32") and bound(job, "reference", "copy_32")]
    if not judged:
        return cannot(claim, f"a model of at least {LARGE:,} parameters with the text statistics' copy_32 "
                             f"(e.g. leviathan)")
    large = max(judged, key=lambda job: finite(job.values.get("parameters")))
    copied, reference = setting(large, "stateful", SEED_DECODER, "copy_32"), bound(large, "reference", "copy_32")
    excess, se = copied[0] - reference[0], _se(copied, reference)
    evidence = (f"copy_32 (the share of a sample's 32-character spans found verbatim in the training split), stateful, "
                f"decoder {SEED_DECODER}: the largest model, {large.model} "
                f"({finite(large.values.get('parameters')):,.0f} parameters), {_fig(copied)} against the reference's "
                f"{_fig(reference)} (held-out text: chance overlaps), excess {excess:+.3f} ± {se:.3f}")
    others = [job for job in text_jobs(jobs) if job is not large and setting(job, "stateful", SEED_DECODER, "copy_32")]
    if others:
        evidence += "; the others: " + ", ".join(
            f"{job.model} {setting(job, 'stateful', SEED_DECODER, 'copy_32')[0]:.3f}" for job in others)
    evidence += (". Rule: supported when the largest model's copy_32 exceeds the reference's by more than two "
                 "standard errors of the difference.")
    return Finding(claim, "supported" if excess > 2 * se else "not shown by this sweep", evidence)


def text_findings(jobs) -> list[Finding]:
    """The findings on the generated text, in TEXT_CLAIMS' order."""
    return [rule(jobs) for rule in (greedy_loop_finding, stateless_noise_finding, line_shape_finding,
                                    early_stateful_finding, copying_finding)]
