"""The planted-recall control (summary.json's "recall", docs/evaluation.md#the-planted-recall-control):
report.md's *Planted recall* table, `recall.png` and the findings on the control, and what the recall costs the
language model; each run's memory horizon and the LSTM's against the GRU's: report/recall_horizon.py. A model that
kept nothing of a key pays log2 K bits (a guess among the K keys): the no-memory line.
"""

import math
from pathlib import Path

from gru_experiments.report.common import MISSING, figure_cell, finish, finite, image, plus_minus, save, subplots, table
from gru_experiments.report.context_classes import class_gain, class_record
from gru_experiments.report.section import Findings, Record, Section, cannot, verdict
from gru_experiments.report.significance import Difference, difference, side, summary_figure
from gru_experiments.report.sweep_folder import mode_pairs
from gru_experiments.study.modes import MODES_BY_CONTEXT, STATEFUL, WINDOWED
from gru_experiments.study.recall import horizon

PLOT_RECALL = "recall.png"


# --- reading the record -------------------------------------------------------------------------------------
recall_record = Record(("recall",), holding="by_distance")
recall_jobs = recall_record.jobs


def no_memory(job) -> float | None:
    """log2 K: the bits per recalled key of a model that kept nothing of it."""
    keys = finite((recall_record(job) or {}).get("keys"))
    return math.log2(keys) if keys is not None and keys >= 1 else None


def inference_window(job) -> int | None:
    window = finite((recall_record(job) or {}).get("window"))
    return None if window is None else int(window)


def distances(job) -> list[int]:
    return sorted(int(key) for key in (recall_record(job) or {}).get("by_distance", {}) if str(key).isdigit())


def recall_point(job, distance: int, inference: str) -> tuple[float, float, int | None] | None:
    """(bits per recalled key, se, targets) at one distance in one inference mode, None when absent."""
    entry = ((recall_record(job) or {}).get("by_distance", {}).get(str(distance)) or {}).get(inference)
    if not isinstance(entry, dict) or finite(entry.get("bits")) is None:
        return None
    targets = finite(entry.get("targets"))
    return finite(entry["bits"]), finite(entry.get("se")) or 0.0, None if targets is None else int(targets)


def points(job, inference: str, window: int | None = None, lies: str | None = None) -> list[tuple[int, tuple]]:
    """(distance, recall_point) where `inference` has a figure; only the distances that lie `lies` ("inside",
    "past") against `window`, where given."""
    return [(d, p) for d in distances(job) if (lies is None or where(d, window) == lies)
            and (p := recall_point(job, d, inference)) is not None]


def recall_figure(distance: int, inference: str = STATEFUL, chance: bool = False):
    """A `figure` for significance.side: one training's (bits per recalled key, se) at `distance` in `inference`,
    less its log2 K where `chance` (negative: it beats a guess among the keys)."""
    def figure(job):
        point, keys = recall_point(job, distance, inference), no_memory(job)
        if point is None or (chance and keys is None):
            return None
        return point[0] - (keys if chance else 0.0), point[1]
    return figure


def recall_difference(a, b, distance: int, a_inference: str = STATEFUL, b_inference: str = STATEFUL):
    """a's recall at `distance` - b's (one run in two inference modes where a is b), over their trainings:
    a significance.Difference, None where a side has no figure."""
    return difference(side(a, recall_figure(distance, a_inference)), side(b, recall_figure(distance, b_inference)))


def beats_chance(job, distance: int, inference: str = STATEFUL) -> bool:
    """Whether the recall at `distance` is below log2 K by two standard errors (significance.difference)."""
    found = difference(side(job, recall_figure(distance, inference, chance=True)))
    return found is not None and found.below


def changes(a, b, window: int | None = None, lies: str | None = None) -> list[tuple[int, tuple, tuple, Difference]]:
    """(distance, a's stateful recall, b's, a - b: recall_difference) where both runs have one; only the
    distances that lie `lies` against `window`, where given."""
    return [(d, p, q, change) for d, p in points(a, STATEFUL, window, lies)
            if (q := recall_point(b, d, STATEFUL)) is not None and (change := recall_difference(a, b, d)) is not None]


def remembered_text(h: dict) -> str:
    """The longest distance recalled under 1 bit, "4,096" (a setting's mean over seeds too), else "none"."""
    return "none" if h["remembered"] is None else f"{h['remembered']:,.0f}"


def crossing_text(h: dict, at: str = "") -> str:
    """Where a horizon rises through 2 bits: `at` and the distance, else "never" (under 2 bits at every distance)
    or "at once" (2 bits or more at the shortest)."""
    crossing = h["crosses_2_bits"]
    return ("never" if h["crossing"].startswith("below") else "at once") if crossing is None else f"{at}{crossing:,.0f}"


def run_horizon(job, mode: str) -> dict:
    """The job's horizon in `mode`, computed from the curve for a record from before recall.horizon."""
    record = recall_record(job) or {}
    return (record.get("horizon") or {}).get(mode) or horizon(record.get("by_distance", {}), mode)


def where(distance: int, window: int | None) -> str:
    """Where a distance lies against a window: inside (d < window), past it (d > window), at its edge."""
    return ("?" if window is None else "inside" if distance < window else "past" if distance > window
            else "at the edge")


# --- report.md ----------------------------------------------------------------------------------------------
def _targets(points) -> str:
    counts = [point[2] for point in points if point is not None and point[2] is not None]
    if not counts:
        return MISSING
    return f"{counts[0]:,}" if len(set(counts)) == 1 else " / ".join(f"{n:,}" for n in counts)


def _settings(job) -> str:
    record = recall_record(job)
    bits = no_memory(job)
    line = (f"- {job.name}, trained on {job.training}: {record.get('keys', '?')} keys, "
            f"{record.get('plantings', '?')} plantings, windowed inference on the last {record.get('window', '?')} "
            f"tokens; no memory: log2 K = " + (MISSING if bits is None else f"{bits:.3f}") + " bits")
    note = str(record.get("note") or "").strip()
    return line + (f". {note}" if note else "")


def recall_section(jobs, plots: dict[str, Path]) -> list[str]:
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## Planted recall", "",
             "A control with a known answer: keys planted in the text and asked for again a given distance later. "
             "Bits per recalled key (± one standard error) in each inference mode; log2 K, a guess among the K keys, "
             "is what a model pays that kept nothing. \"Training window\": where the distance lies against the "
             "window the run was trained on (inside: shorter than it).", ""]
    order = sorted(((d, i, job) for i, job in enumerate(shown) for d in distances(job)), key=lambda r: r[:2])
    names = len({job.name for job in shown}) > 1
    rows = []
    for distance, _, job in order:
        points = [recall_point(job, distance, inference) for inference in MODES_BY_CONTEXT]
        bits = no_memory(job)
        rows.append([str(distance), f"{job.name}, {job.training}" if names else job.training,
                     where(distance, job.training_window),
                     *(plus_minus(*(p or (None, None))[:2]) for p in points),
                     _targets(points), MISSING if bits is None else f"{bits:.3f}"])
    lines += table(["distance", "training", "training window", *MODES_BY_CONTEXT, "targets", "log2 K"], rows, "rllr")
    lines += [""] + [_settings(job) for job in shown]
    lines += ["", image("recall bits against distance, by training and inference mode", PLOT_RECALL, plots,
                        "no recall figure."), ""]
    return lines


# --- the figure ---------------------------------------------------------------------------------------------
def _panel(ax, shown, inference: str, names: bool) -> None:
    for job in shown:
        found = points(job, inference)
        if not found:
            continue
        label = f"{job.name}, {job.training}" if names else f"trained on {job.training}"
        (line, *_) = ax.errorbar([d for d, _ in found], [p[0] for _, p in found], yerr=[p[1] for _, p in found],
                                 marker="o", markersize=3, capsize=2, label=label)
        if job.training_window is not None:
            ax.axvline(job.training_window, color=line.get_color(), linestyle=":", linewidth=1)
    for bits in sorted({no_memory(job) for job in shown} - {None}):
        ax.axhline(bits, color="black", linestyle="--", linewidth=1, label=f"no memory: log2 K = {bits:.2f}")
    if inference == WINDOWED:
        for window in sorted({inference_window(job) for job in shown} - {None}):
            ax.axvline(window, color="grey", linewidth=1, alpha=0.6, label=f"inference window {window}")
    ax.set_xscale("log", base=2)
    finish(ax, 6, title=f"{inference} inference", xlabel="distance from the key (tokens); dotted: training window",
           ylabel="bits per recalled key (lower: remembered)")


def plot_recall(jobs, path: Path) -> Path | None:
    """Recall bits against distance (log x), a panel per inference mode, a line per run; log2 K dashed."""
    shown = recall_jobs(jobs)
    if not shown or not any(distances(job) for job in shown):
        return None
    fig, axes = subplots(1, len(MODES_BY_CONTEXT), figsize=(5.0 * len(MODES_BY_CONTEXT), 4.0), sharey=True)
    names = len({job.name for job in shown}) > 1
    for ax, inference in zip(axes, MODES_BY_CONTEXT):
        _panel(ax, shown, inference, names)
    fig.tight_layout()
    return save(fig, path)


# --- the findings -------------------------------------------------------------------------------------------
RECALL = Findings("Findings on the planted-recall control", "What a control with a known answer shows: keys planted "
                  "in the text and recalled at known distances (*Planted recall*).")
# Two figures are told apart by significance.difference (recall_difference, beats_chance).


def _at(points) -> str:
    return ", ".join(f"d = {d}: {plus_minus(bits, se)}" for d, (bits, se, _) in points)


def _instrument_part(job) -> tuple[bool, bool, str]:
    """(detected, the windowed control fails, the evidence) of one run."""
    window, seen = job.training_window, inference_window(job)
    detected = [(d, p) for d, p in points(job, STATEFUL, window, "inside") if beats_chance(job, d, STATEFUL)]
    part = (f"{job.name} trained on {job.training} (log2 K = {no_memory(job):.3f}): stateful below "
            "log2 K by more than two standard errors "
            + (f"at {_at(detected)}" if detected else "at no distance inside its training window"))
    past = points(job, WINDOWED, seen, "past")
    leaks = [d for d, _ in past if beats_chance(job, d, WINDOWED)]
    if past:
        part += (f"; windowed past its window ({seen} tokens) at {_at(past)}: "
                 + (f"below log2 K at d = {', '.join(map(str, leaks))}" if leaks else "at chance"))
    else:
        part += "; no distance past the windowed mode's window to check it against"
    return bool(detected), bool(leaks), part


@RECALL.claim("The planted-recall instrument detects a dependency the model has learned")
def instrument_finding(jobs) -> tuple[str, str]:
    """Does a run's stateful recall inside its training window beat a guess among the keys, while the
    windowed mode, past its window, cannot?"""
    judged = [job for job in recall_jobs(jobs) if no_memory(job) is not None and distances(job)]
    if not judged:
        return cannot("a run of the planted-recall corpus (summary.json's recall, with its keys and distances)")
    parts = [_instrument_part(job) for job in judged]
    detected, leaking = sum(d for d, _, _ in parts), sum(leak for _, leak, _ in parts)
    evidence = ("Bits per recalled key ± one standard error: " + "; ".join(part for _, _, part in parts)
                + ". Rule: the instrument detects a learned dependency when, for some run, stateful recall at a "
                "distance inside the training window (shorter than it) is below log2 K by more than two standard "
                "errors; it distinguishes when the windowed mode, past its window (where the key is out of sight), "
                f"is not. Detected in {detected} of {len(judged)} runs; windowed below log2 K past its window in "
                f"{leaking}.")
    return ("not shown by this sweep" if not detected else "partly supported" if leaking else "supported", evidence)


def _pair_part(windows, streams, others) -> tuple[int, int, int, str]:
    """(better, worse, distances judged, evidence) of one pair, past the training window."""
    window, bits = streams.training_window, no_memory(streams)
    found = changes(streams, windows, window, "past")
    better, worse = sum(c.below for *_, c in found), sum(c.above for *_, c in found)
    parts = [f"d = {d}: streams {plus_minus(s[0], s[1])}, windows {plus_minus(w[0], w[1])} (change {c.text(3)})"
             for d, s, w, c in found]
    text = (f"{streams.name}, training window {window}, log2 K = "
            + ("?" if bits is None else f"{bits:.3f}") + ": " + ("; ".join(parts) or "no distance past it"))
    for other in others:
        if found := points(other, STATEFUL, window, "past"):
            text += f" (trained on {other.training}: {_at(found)})"
    return better, worse, len(found), text


@RECALL.claim("Training with the state carried makes the state worth carrying, on the planted-recall corpus")
def recall_carried_state_finding(jobs) -> tuple[str, str]:
    """(The streams finding, on the planted corpus.) Past the training window, is stateful recall better after
    training on streams than after training on windows of the same length?"""
    pairs = mode_pairs(recall_jobs(jobs))
    if not pairs:
        return cannot("planted-recall runs of one model trained on windows and on streams with the same "
                      "training window")
    used = {id(job) for pair in pairs for job in pair}
    others = [job for job in recall_jobs(jobs) if id(job) not in used]
    results = [_pair_part(windows, streams, [o for o in others if o.name == streams.name])
               for windows, streams in pairs]
    judged = sum(n for _, _, n, _ in results)
    evidence = ("Stateful bits per recalled key past the training window (distance longer than it), ± one standard "
                "error, the change streams - windows ± hypot of the two (over seeds: the spread between "
                "trainings): " + "; ".join(t for *_, t in results)
                + ". Rule: supported at a distance when streams is below windows by more than two standard errors "
                "of the change; supported when it is at every distance past the window, partly at some, "
                "contradicted when streams is above windows by two standard errors at every one.")
    if not judged:
        return ("cannot be judged", evidence + " Missing: distances past the training window.")
    better, worse = sum(b for b, _, _, _ in results), sum(w for _, w, _, _ in results)
    evidence += f" Streams better at {better} of {judged} distances, worse at {worse}."
    return (verdict(better, judged, worse), evidence)


def _kept_part(job) -> tuple[bool, str]:
    """(stateful beats windowed at the first distance past the training window, the evidence) of one run."""
    window = job.training_window
    past = [(d, s, w) for d, s in points(job, STATEFUL, window, "past") if (w := recall_point(job, d, WINDOWED))]
    kept = [d for d, _, _ in past if (gap := recall_difference(job, job, d, STATEFUL, WINDOWED)) and gap.below]
    h = run_horizon(job, STATEFUL)
    crossing = ("nowhere (under 2 bits at every distance)" if h["crossing"].startswith("below") else
                "already at the shortest distance" if h["crosses_2_bits"] is None else
                f"at d ≈ {h['crosses_2_bits']:,.0f} ({h['crosses_2_bits'] / window:.1f}× the window)")
    text = (f"{job.name} trained on {job.training}: stateful below windowed by more than two standard "
            f"errors of the difference at {len(kept)} of {len(past)} distances past the window"
            + (f" (d = {past[0][0]}: stateful {plus_minus(*past[0][1][:2])}, windowed {plus_minus(*past[0][2][:2])})"
               if past else "")
            + f"; stateful under 1 bit up to d = {remembered_text(h)}, crossing 2 bits {crossing}")
    return bool(past) and past[0][0] in kept, text


@RECALL.claim("A carried state keeps what the model learned past its training window")
def kept_past_window_finding(jobs) -> tuple[str, str]:
    """Past its training window, where the windowed mode cannot see the key, does the carried state still
    recall it? Judged on the recurrent runs; a finite-context model (the transformer) is the control."""
    runs = [job for job in recall_jobs(jobs) if job.training_window and distances(job)]
    recurrent = [job for job in runs if job.recurrent]
    if not recurrent:
        return cannot("a recurrent run of the planted-recall corpus with distances past its training window")
    parts = [_kept_part(job) for job in recurrent]
    controls = [_kept_part(job)[1] for job in runs if not job.recurrent]
    kept = sum(k for k, _ in parts)
    evidence = ("Bits per recalled key ± one standard error: " + "; ".join(text for _, text in parts)
                + (". Control, a model of its last tokens only: " + "; ".join(controls) if controls else "")
                + ". Rule: a run keeps the key past its window when, at the first validation distance past it, "
                "stateful recall is below windowed by more than two standard errors of the difference (hypot of "
                "the two; over seeds: the spread between trainings); supported when every recurrent run does. "
                f"Kept in {kept} of {len(parts)} runs.")
    return (verdict(kept, len(parts), against=0), evidence)


SECTION = Section("planted recall", recall_section, plots={PLOT_RECALL: plot_recall}, findings=RECALL)


# --- what learning the recall costs the language model ------------------------------------------------
def twin(job, jobs):
    """The completed job of the same model, training mode and window without the probe, None if none."""
    return next((other for other in jobs if other.status == "completed" and not recall_record(other)
                 and other.values.get("probe") in (None, "none") and other.name == job.name
                 and other.training_mode == job.training_mode and other.training_window == job.training_window),
                None)


def _cost(job, plain) -> str:
    """Stateful bits per character with the probe - without, ± one standard error (significance.difference)."""
    cost = difference(side(job, summary_figure("stateful_bpc")), side(plain, summary_figure("stateful_bpc")))
    return MISSING if cost is None else cost.text(4)


def most_helped_class(job) -> str:
    """The class of target where the state helps most (the lowest class state gain), with that gain."""
    gains = [(name, class_gain(job, name, "bpc"), class_gain(job, name, "se")) for name in class_record(job) or {}]
    gains = [g for g in gains if g[1] is not None]
    if not gains:
        return MISSING
    name, gain, se = min(gains, key=lambda g: g[1])
    return f"{name}: {plus_minus(gain, se, 4, '+')}"


def cost_section(jobs, plots: dict) -> list[str]:
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## What the recall costs the language model", "",
             "Each run with the probe beside its twin without it (same model, training mode and window), on the plain "
             "validation split: stateful bits per character ± se, the cost (with - without ± the two se's hypot; over "
             "seeds: the spread between trainings), stateful - windowed ± its paired se (negative: carrying the state "
             "helps) and the kind of target where it helps most (the context curve by class: stateful - windowed on "
             "those targets).", ""]
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


COST = Section("what the recall costs", cost_section)
