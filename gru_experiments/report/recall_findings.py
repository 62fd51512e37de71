"""The findings of the planted-recall control (summary.json's "recall"; recall_report.py), judged by the
numbers of one sweep (report.md's *Findings on the planted-recall control*):

    the instrument detects a dependency the model has learned
    training with the state carried makes the state worth carrying, judged again on the planted
    corpus (the study's finding 6 is judged on real text by findings.carried_state_finding)
    a carried state keeps what the model learned past its training window

Bits per recalled key ± one standard error; a difference of two figures has the standard error
hypot(se1, se2); log2 K is the bits a model pays that kept nothing of the key.
"""

from __future__ import annotations

import math

from gru_experiments.report.finding import Finding, cannot, plus_minus
from gru_experiments.report.recall_horizon import run_horizon
from gru_experiments.report.recall_report import (
    distances,
    inference_window,
    model_name,
    no_memory,
    recall_jobs,
    recall_point,
    training_label,
    training_mode,
    training_window,
    where,
)

RECALL_CLAIMS = (
    "The planted-recall instrument detects a dependency the model has learned",
    "Training with the state carried makes the state worth carrying, on the planted-recall corpus",
    "A carried state keeps what the model learned past its training window",
)


def _at(points) -> str:
    return ", ".join(f"d = {d}: {plus_minus(bits, se)}" for d, (bits, se, _) in points)


def _below_chance(job, inference: str, chosen) -> list[tuple[int, tuple]]:
    """(distance, point) where `inference`'s bits lie below log2 K by more than two standard errors, among
    the distances `chosen(d)` accepts."""
    bits = no_memory(job)
    return [(d, p) for d in distances(job) if chosen(d) and (p := recall_point(job, d, inference)) is not None
            and bits - p[0] > 2 * p[1]]


def _instrument_part(job) -> tuple[bool, bool, str]:
    """(detected, the windowed control fails, the evidence) of one run."""
    window, seen = training_window(job), inference_window(job)
    detected = _below_chance(job, "stateful", lambda d: window is not None and where(d, window) == "inside")
    part = (f"{model_name(job)} trained on {training_label(job)} (log2 K = {no_memory(job):.3f}): stateful below "
            "log2 K by more than two standard errors "
            + (f"at {_at(detected)}" if detected else "at no distance inside its training window"))
    past = [(d, p) for d in distances(job) if seen is not None and d > seen
            and (p := recall_point(job, d, "windowed")) is not None]
    leaks = _below_chance(job, "windowed", lambda d: seen is not None and d > seen)
    if past:
        part += (f"; windowed past its window ({seen} tokens) at {_at(past)}: "
                 + (f"below log2 K at d = {', '.join(str(d) for d, _ in leaks)}" if leaks else "at chance"))
    else:
        part += "; no distance past the windowed mode's window to check it against"
    return bool(detected), bool(leaks), part


def instrument_finding(jobs) -> Finding:
    """Does a run's stateful recall inside its training window beat a guess among the keys, while the
    windowed mode, past its window, cannot?"""
    claim = RECALL_CLAIMS[0]
    judged = [job for job in recall_jobs(jobs) if no_memory(job) is not None and distances(job)]
    if not judged:
        return cannot(claim, "a run of the planted-recall corpus (summary.json's recall, with its keys and distances)")
    parts = [_instrument_part(job) for job in judged]
    detected, leaking = sum(d for d, _, _ in parts), sum(leak for _, leak, _ in parts)
    evidence = ("Bits per recalled key ± one standard error: " + "; ".join(part for _, _, part in parts)
                + ". Rule: the instrument detects a learned dependency when, for some run, stateful recall at a "
                "distance inside the training window (shorter than it) is below log2 K by more than two standard "
                "errors; it distinguishes when the windowed mode, past its window (where the key is out of sight), "
                f"is not. Detected in {detected} of {len(judged)} runs; windowed below log2 K past its window in "
                f"{leaking}.")
    if not detected:
        return Finding(claim, "not shown by this sweep", evidence)
    return Finding(claim, "partly supported" if leaking else "supported", evidence)


def recall_pairs(jobs) -> list[tuple]:
    """(windows job, streams job) of each model with recall runs in both training modes at one training
    window (the windows run of another window, e.g. 512, is no pair for them)."""
    pairs = []
    runs = recall_jobs(jobs)
    for streams in (job for job in runs if training_mode(job) == "streams"):
        same = [job for job in runs if training_mode(job) == "windows" and job.values.get("model")
                == streams.values.get("model") and training_window(job) == training_window(streams)]
        if same:
            pairs.append((same[0], streams))
    return pairs


def _pair_part(windows, streams, others) -> tuple[int, int, int, str]:
    """(better, worse, distances judged, evidence) of one pair, past the training window."""
    window, bits = training_window(streams), no_memory(streams)
    judged, better, worse, parts = 0, 0, 0, []
    for d in distances(streams):
        w, s = recall_point(windows, d, "stateful"), recall_point(streams, d, "stateful")
        if where(d, window) != "past" or w is None or s is None:
            continue
        change, se = s[0] - w[0], math.hypot(s[1], w[1])
        judged, better, worse = judged + 1, better + (change < -2 * se), worse + (change > 2 * se)
        parts.append(f"d = {d}: streams {plus_minus(s[0], s[1])}, windows {plus_minus(w[0], w[1])} "
                     f"(change {change:+.3f} ± {se:.3f})")
    text = (f"{model_name(streams)}, training window {window}, log2 K = "
            + ("?" if bits is None else f"{bits:.3f}") + ": " + ("; ".join(parts) or "no distance past it"))
    for other in others:
        points = [(d, p) for d in distances(other) if where(d, window) == "past"
                  and (p := recall_point(other, d, "stateful")) is not None]
        if points:
            text += f" (trained on {training_label(other)}: {_at(points)})"
    return better, worse, judged, text


def recall_carried_state_finding(jobs) -> Finding:
    """(Finding 6 on the planted corpus.) Past the training window, is stateful recall better after training
    on streams than after training on windows of the same length?"""
    claim = RECALL_CLAIMS[1]
    pairs = recall_pairs(jobs)
    if not pairs:
        return cannot(claim, "planted-recall runs of one model trained on windows and on streams with the same "
                             "training window")
    used = {id(job) for pair in pairs for job in pair}
    others = [job for job in recall_jobs(jobs) if id(job) not in used]
    results = [_pair_part(windows, streams, [o for o in others if o.values.get("model") == streams.values.get("model")])
               for windows, streams in pairs]
    judged = sum(n for _, _, n, _ in results)
    evidence = ("Stateful bits per recalled key past the training window (distance longer than it), ± one standard "
                "error, the change streams - windows ± hypot of the two: " + "; ".join(t for *_, t in results)
                + ". Rule: supported at a distance when streams is below windows by more than two standard errors "
                "of the change; supported when it is at every distance past the window, partly at some, "
                "contradicted when streams is above windows by two standard errors at every one.")
    if not judged:
        return Finding(claim, "cannot be judged", evidence + " Missing: distances past the training window.")
    better, worse = sum(b for b, _, _, _ in results), sum(w for _, w, _, _ in results)
    evidence += f" Streams better at {better} of {judged} distances, worse at {worse}."
    verdict = ("supported" if better == judged else "partly supported" if better else
               "contradicted" if worse == judged else "not shown by this sweep")
    return Finding(claim, verdict, evidence)


def _kept_part(job) -> tuple[bool, str]:
    """(stateful beats windowed at the first distance past the training window, the evidence) of one run."""
    window = training_window(job)
    past = [(d, s, w) for d in distances(job) if where(d, window) == "past"
            and (s := recall_point(job, d, "stateful")) is not None and (w := recall_point(job, d, "windowed"))]
    kept = [d for d, s, w in past if w[0] - s[0] > 2 * math.hypot(s[1], w[1])]
    h = run_horizon(job, "stateful")
    crossing = ("nowhere (under 2 bits at every distance)" if h["crossing"].startswith("below") else
                "already at the shortest distance" if h["crosses_2_bits"] is None else
                f"at d ≈ {h['crosses_2_bits']:,.0f} ({h['crosses_2_bits'] / window:.1f}× the window)")
    text = (f"{model_name(job)} trained on {training_label(job)}: stateful below windowed by more than two standard "
            f"errors of the difference at {len(kept)} of {len(past)} distances past the window"
            + (f" (d = {past[0][0]}: stateful {plus_minus(*past[0][1][:2])}, windowed {plus_minus(*past[0][2][:2])})"
               if past else "")
            + f"; stateful under 1 bit up to d = {h['remembered'] or 'none'}, crossing 2 bits {crossing}")
    return bool(past) and past[0][0] in kept, text


def kept_past_window_finding(jobs) -> Finding:
    """Past its training window, where the windowed mode cannot see the key, does the carried state still
    recall it? Judged on the recurrent runs; a finite-context model (the transformer) is the control."""
    claim = RECALL_CLAIMS[2]
    runs = [job for job in recall_jobs(jobs) if training_window(job) and distances(job)]
    recurrent = [job for job in runs if job.values.get("context") is None]
    if not recurrent:
        return cannot(claim, "a recurrent run of the planted-recall corpus with distances past its training window")
    parts = [_kept_part(job) for job in recurrent]
    controls = [_kept_part(job)[1] for job in runs if job.values.get("context") is not None]
    kept = sum(k for k, _ in parts)
    evidence = ("Bits per recalled key ± one standard error: " + "; ".join(text for _, text in parts)
                + (". Control, a model of its last tokens only: " + "; ".join(controls) if controls else "")
                + ". Rule: a run keeps the key past its window when, at the first validation distance past it, "
                "stateful recall is below windowed by more than two standard errors of the difference (hypot of "
                f"the two); supported when every recurrent run does. Kept in {kept} of {len(parts)} runs.")
    return Finding(claim, "supported" if kept == len(parts) else "partly supported" if kept else
                   "not shown by this sweep", evidence)


def recall_findings(jobs) -> list[Finding]:
    """The findings of the planted-recall control, in RECALL_CLAIMS' order."""
    return [instrument_finding(jobs), recall_carried_state_finding(jobs), kept_past_window_finding(jobs)]
