"""The context curve by class of target (summary.json's context_curve.by_class): report.md's *Context
curve by class of target* tables and `context_by_class.png`. Per class: its targets, its curve with
standard errors, and its state gain (stateful - windowed, paired) ± se.
"""

from pathlib import Path

from gru_experiments.report.common import cell, finish, finite, image, ordered, plus_minus, save, subplots, table
from gru_experiments.report.plots import curve_to_stateful
from gru_experiments.report.section import Record, Section
from gru_experiments.report.sweep_folder import run_label
from gru_experiments.study.modes import STATEFUL
from gru_experiments.study.target_classes import CLASSES, LONG_COPY

SHOWN = (*CLASSES, LONG_COPY)  # the partition's classes, then the overlay
PLOT_CLASSES = "context_by_class.png"


class_record = Record(("context_curve", "by_class"))  # {class: {"targets", "curve", "se", "state_gain"}}
class_jobs = class_record.jobs


def class_gain(job, name: str, key: str) -> float | None:
    """The class's state gain ("bpc") or its standard error ("se"), None without."""
    entry = (class_record(job) or {}).get(name)
    gain = entry.get("state_gain") if isinstance(entry, dict) else None
    return finite(gain.get(key)) if isinstance(gain, dict) else None


CLASS_COLUMNS = {f"{name}_state_gain_{key}": (lambda job, name=name, key=key: class_gain(job, name, key))
                 for name in (LONG_COPY, "word_start") for key in ("bpc", "se")}  # results.csv's class columns


def class_points(entry: dict) -> tuple[list[tuple[int, float, float | None]], tuple[float, float | None] | None]:
    """([(context, bpc, se), ...] in increasing context, (stateful bpc, se) or None) of one class."""
    curve, se = entry.get("curve") or {}, entry.get("se") or {}
    points = sorted((int(key), finite(bpc), finite(se.get(key))) for key, bpc in curve.items()
                    if str(key).isdigit() and finite(bpc) is not None)
    stateful = finite(curve.get(STATEFUL))
    return points, None if stateful is None else (stateful, finite(se.get(STATEFUL)))


def _row(name: str, entry: dict, contexts: list[int]) -> list[str]:
    points, stateful = class_points(entry)
    by_context = {w: (bpc, se) for w, bpc, se in points}
    gain = entry.get("state_gain") or {}
    figures = [by_context.get(w, (None, None)) for w in contexts] + [stateful or (None, None)]
    return [name, cell(finite(entry.get("targets")), "{:,.0f}".format),
            *(plus_minus(bpc, se or None) for bpc, se in figures),  # se 0: exact (every target), none written
            plus_minus(finite(gain.get("bpc")), finite(gain.get("se")), 4, "+")]


def class_section(jobs, plots: dict[str, Path]) -> list[str]:
    shown = class_jobs(jobs)
    if not shown:
        return []
    lines = ["## Context curve by class of target", "",
             "The context curve of each class of target: the first character of a word (word_start), the others "
             "of a word (word_inside), the first of a line (line_start) and the rest (other), which partition "
             "the targets; and, over them, long_copy: the characters of a word last seen further back than the "
             "window but within the curve's longest point. Bits per character (± one standard error; none: "
             "exact) at each context, stateful, and the state gain (stateful - windowed, paired; negative: the "
             "carried state helps). Final weights.", ""]
    for job in shown:
        record = class_record(job)
        names = ordered(record, SHOWN)
        contexts = sorted({w for name in names for w, _, _ in class_points(record[name] or {})[0]})
        lines += [f"### {run_label(job, jobs)}", ""]
        lines += table(["class", "targets", *(str(w) for w in contexts), STATEFUL, "state gain"],
                       [_row(name, record[name] or {}, contexts) for name in names], "lr") + [""]
    lines += [image("bits per character against context, by class of target", PLOT_CLASSES, plots,
                    "no figure of the classes."), ""]
    return lines


def _class_panel(ax, job, label: str) -> None:
    record = class_record(job)
    ticks = sorted({w for entry in record.values() for w, _, _ in class_points(entry or {})[0]})
    stateful_x = max(ticks, default=1) * 4
    for name in ordered(record, SHOWN):
        points, stateful = class_points(record[name] or {})
        if not points:
            continue
        curve_to_stateful(ax, [w for w, _, _ in points], [bpc for _, bpc, _ in points], stateful and stateful[0],
                          stateful_x, linestyle="--" if name == LONG_COPY else "-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks([*ticks, stateful_x], [*(str(t) for t in ticks), STATEFUL], fontsize=7)
    finish(ax, 6, title=label, xlabel="tokens of context (from the initial state)", ylabel="bits per character")


def plot_classes(jobs, path: Path) -> Path | None:
    """A panel per run: a line per class against the context (long_copy dashed), stateful at the right."""
    shown = class_jobs(jobs)
    if not shown:
        return None
    columns = min(3, len(shown))
    rows = -(-len(shown) // columns)
    fig, axes = subplots(rows, columns, figsize=(5.2 * columns, 4.0 * rows), squeeze=False)
    for ax, job in zip(axes.flat, shown):
        _class_panel(ax, job, run_label(job, jobs))
    for ax in list(axes.flat)[len(shown):]:
        ax.set_axis_off()
    fig.tight_layout()
    return save(fig, path)


# column_rank 1: results.csv has had these columns after the generated text's, whose section comes later
SECTION = Section("context curve by class", class_section, columns=CLASS_COLUMNS, plots={PLOT_CLASSES: plot_classes},
                  column_rank=1)
