"""The planted-recall control (summary.json's "recall"): report.md's *Planted recall* table and `recall.png`.

A run's record: K keys, planted R times each at given distances before their recall in a corpus
otherwise like the real one, and per distance, per inference mode (stateful, windowed, stateless),
the bits per recalled key with their standard error and the targets scored. A model that kept nothing
of the key pays log2 K bits (a uniform guess among the K): the no-memory line. A run is told apart by
its training mode and training window (summary.json's training_mode and mode_evaluation.seq_len):
"windows (128)", "streams (128)", "windows (512)".
"""

from __future__ import annotations

import math
from pathlib import Path

from gru_experiments.report.finding import finite, plus_minus
from gru_experiments.report.plots import _figure, _save
from gru_experiments.report.sweep_folder import MISSING

INFERENCE = ("stateful", "windowed", "stateless")
PLOT_RECALL = "recall.png"


# --- reading the record -------------------------------------------------------------------------------------
def recall_record(job) -> dict | None:
    """The job's recall record (summary.json's "recall"), None when it has none."""
    record = job.values.get("recall")
    return record if isinstance(record, dict) and isinstance(record.get("by_distance"), dict) else None


def recall_jobs(jobs) -> list:
    """The completed jobs with a recall record, in launch order."""
    return [job for job in jobs if getattr(job, "status", "completed") == "completed" and recall_record(job)]


def training_window(job) -> int | None:
    """The tokens a training window held (mode_evaluation.seq_len; else the recall record's seq_len)."""
    for source in (job.values.get("mode_evaluation"), recall_record(job)):
        seq_len = finite((source or {}).get("seq_len"))
        if seq_len is not None:
            return int(seq_len)
    return None


def model_name(job) -> str:
    """The model's config name (JobResult.model marks a streams run: here the training says it)."""
    return job.values.get("model") or job.model


def training_mode(job) -> str:
    return job.values.get("training_mode") or "windows"  # summaries from before the choice: windows


def training_label(job) -> str:
    """"windows (128)": the training mode and its window."""
    window = training_window(job)
    return training_mode(job) if window is None else f"{training_mode(job)} ({window})"


def no_memory(job) -> float | None:
    """log2 K: the bits per recalled key of a model that kept nothing of it."""
    keys = finite((recall_record(job) or {}).get("keys"))
    return math.log2(keys) if keys is not None and keys >= 1 else None


def inference_window(job) -> int | None:
    """The windowed inference mode's window (the recall record's "window")."""
    window = finite((recall_record(job) or {}).get("window"))
    return None if window is None else int(window)


def distances(job) -> list[int]:
    """The planted distances of the record, in increasing order."""
    return sorted(int(key) for key in (recall_record(job) or {}).get("by_distance", {}) if str(key).isdigit())


def recall_point(job, distance: int, inference: str) -> tuple[float, float, int | None] | None:
    """(bits per recalled key, se, targets) at one distance in one inference mode, None when absent."""
    entry = ((recall_record(job) or {}).get("by_distance", {}).get(str(distance)) or {}).get(inference)
    if not isinstance(entry, dict) or finite(entry.get("bits")) is None:
        return None
    targets = finite(entry.get("targets"))
    return finite(entry["bits"]), finite(entry.get("se")) or 0.0, None if targets is None else int(targets)


def where(distance: int, window: int | None) -> str:
    """Where a distance lies against a window: inside (d < window), past it (d > window), at its edge."""
    if window is None:
        return "?"
    return "inside" if distance < window else "past" if distance > window else "at the edge"


# --- report.md ----------------------------------------------------------------------------------------------
def _targets(points) -> str:
    counts = [point[2] for point in points if point is not None and point[2] is not None]
    if not counts:
        return MISSING
    return f"{counts[0]:,}" if len(set(counts)) == 1 else " / ".join(f"{n:,}" for n in counts)


def _settings(job) -> str:
    record = recall_record(job)
    bits = no_memory(job)
    line = (f"- {model_name(job)}, trained on {training_label(job)}: {record.get('keys', '?')} keys, "
            f"{record.get('plantings', '?')} plantings, windowed inference on the last {record.get('window', '?')} "
            f"tokens; no memory: log2 K = " + (MISSING if bits is None else f"{bits:.3f}") + " bits")
    note = str(record.get("note") or "").strip()
    return line + (f". {note}" if note else "")


def recall_section(jobs, plots: dict[str, Path]) -> list[str]:
    """report.md's *Planted recall* section ([] when no job has a recall record)."""
    shown = recall_jobs(jobs)
    if not shown:
        return []
    lines = ["## Planted recall", "",
             "A control with a known answer: keys planted in the text and asked for again a given distance later. "
             "Bits per recalled key (± one standard error) in each inference mode; log2 K, a guess among the K keys, "
             "is what a model pays that kept nothing. \"Training window\": where the distance lies against the "
             "window the run was trained on (inside: shorter than it).", "",
             "| distance | training | training window | " + " | ".join(INFERENCE) + " | targets | log2 K |",
             "|--:|---|---|" + "--:|" * (len(INFERENCE) + 2)]
    rows = sorted(((d, i, job) for i, job in enumerate(shown) for d in distances(job)), key=lambda r: r[:2])
    names = len({model_name(job) for job in shown}) > 1
    for distance, _, job in rows:
        points = [recall_point(job, distance, inference) for inference in INFERENCE]
        label = f"{model_name(job)}, {training_label(job)}" if names else training_label(job)
        bits = no_memory(job)
        lines.append(f"| {distance} | {label} | {where(distance, training_window(job))} | "
                     + " | ".join(MISSING if p is None else plus_minus(p[0], p[1]) for p in points)
                     + f" | {_targets(points)} | {MISSING if bits is None else f'{bits:.3f}'} |")
    lines += [""] + [_settings(job) for job in shown]
    lines += ["", f"![recall bits against distance, by training and inference mode]({PLOT_RECALL})"
              if PLOT_RECALL in plots else f"{MISSING} no recall figure.", ""]
    return lines


# --- the figure ---------------------------------------------------------------------------------------------
def _panel(ax, shown, inference: str, names: bool) -> None:
    for job in shown:
        points = [(d, p) for d in distances(job) if (p := recall_point(job, d, inference)) is not None]
        if not points:
            continue
        label = f"{model_name(job)}, {training_label(job)}" if names else f"trained on {training_label(job)}"
        (line, *_) = ax.errorbar([d for d, _ in points], [p[0] for _, p in points], yerr=[p[1] for _, p in points],
                                 marker="o", markersize=3, capsize=2, label=label)
        if training_window(job) is not None:
            ax.axvline(training_window(job), color=line.get_color(), linestyle=":", linewidth=1)
    for bits in sorted({no_memory(job) for job in shown} - {None}):
        ax.axhline(bits, color="black", linestyle="--", linewidth=1, label=f"no memory: log2 K = {bits:.2f}")
    if inference == "windowed":
        for window in sorted({inference_window(job) for job in shown} - {None}):
            ax.axvline(window, color="grey", linewidth=1, alpha=0.6, label=f"inference window {window}")
    ax.set_xscale("log", base=2)
    ax.set(title=f"{inference} inference", xlabel="distance from the key (tokens); dotted: training window",
           ylabel="bits per recalled key (lower: remembered)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def plot_recall(jobs, path: Path) -> Path | None:
    """Recall bits against distance (log x): a panel per inference mode, a line per trained run, its
    training window as a dotted vertical line, log2 K dashed."""
    shown = recall_jobs(jobs)
    if not shown or not any(distances(job) for job in shown):
        return None
    plt = _figure()
    fig, axes = plt.subplots(1, len(INFERENCE), figsize=(5.0 * len(INFERENCE), 4.0), sharey=True)
    names = len({model_name(job) for job in shown}) > 1
    for ax, inference in zip(axes, INFERENCE):
        _panel(ax, shown, inference, names)
    fig.tight_layout()
    return _save(fig, path)
