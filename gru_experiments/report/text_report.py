"""The generated text measured (summary.json's "text", study/text_protocol.py): report.md's *Generated
text* section, results.csv's text columns and `text_statistics.png`.

A run's record holds, per inference mode × decoder, each statistic's value and standard error over
the samples (text_stats.STATISTICS), the same statistics of held-out text (the reference), of random
strings (the floor) and of a looped phrase (the ceiling), and, where drawn, the drift: the statistics
of each stretch of long generations. A summary written before the record existed has none; the
section and the figure are then left out.
"""

from __future__ import annotations

from pathlib import Path

from gru_experiments.report.finding import finite, plus_minus
from gru_experiments.report.plots import _figure, _save
from gru_experiments.report.sweep_folder import MISSING, run_label
from gru_experiments.study.text_protocol import DECODERS, DRIFT_SHOWN, TEXT_MODES
from gru_experiments.study.text_stats import STATISTICS

SEED_DECODER = "temperature_0.8"  # the seed's decoder: the one the findings and results.csv read
BOUNDS = {"reference": "reference (validation)", "floor": "random (floor)", "ceiling": "looped (ceiling)"}
PLOT_TEXT = "text_statistics.png"
SHOWN = ("word_validity", "loop_rate")  # the figure's bar panels


# --- reading the record -------------------------------------------------------------------------------------
def text_record(job) -> dict | None:
    """The job's text record (summary.json's "text"), None when it has none."""
    record = job.values.get("text")
    return record if isinstance(record, dict) and isinstance(record.get("modes"), dict) else None


def text_jobs(jobs) -> list:
    """The completed jobs with a text record, in launch order."""
    return [job for job in jobs if getattr(job, "status", "completed") == "completed" and text_record(job)]


def _pair(entry) -> tuple[float, float | None] | None:
    """(value, standard error or None) of a {"value", "se"} entry; None without a finite value."""
    if not isinstance(entry, dict) or finite(entry.get("value")) is None:
        return None
    return finite(entry["value"]), finite(entry.get("se"))


def setting(job, mode: str, decoder: str, statistic: str) -> tuple[float, float | None] | None:
    """(value, se) of one statistic of the samples of one mode and decoder."""
    record = text_record(job) or {}
    return _pair(((record.get("modes", {}).get(mode) or {}).get(decoder) or {}).get(statistic))


def bound(job, which: str, statistic: str) -> tuple[float, float | None] | None:
    """(value, se) of the reference's, the floor's or the ceiling's statistic (`which`)."""
    return _pair(((text_record(job) or {}).get(which) or {}).get(statistic))


def value(job, mode: str, decoder: str, statistic: str) -> float | None:
    figure = setting(job, mode, decoder, statistic)
    return None if figure is None else figure[0]


def _ordered(keys, preferred) -> list:
    """`keys` with those of `preferred` first, in its order, then the rest as they came."""
    keys = list(dict.fromkeys(keys))
    return [key for key in preferred if key in keys] + [key for key in keys if key not in preferred]


def text_rows(record: dict) -> list[tuple[str, dict]]:
    """(label, {statistic: entry}) per mode × decoder, then the reference, the floor and the ceiling."""
    rows = []
    for mode in _ordered(record["modes"], TEXT_MODES):
        by_decoder = record["modes"][mode] or {}
        rows += [(f"{mode}, {decoder}", by_decoder[decoder] or {}) for decoder in _ordered(by_decoder, DECODERS)]
    return rows + [(label, record.get(which) or {}) for which, label in BOUNDS.items()]


def _cell(entry) -> str:
    figure = _pair(entry)
    return MISSING if figure is None else plus_minus(*figure)


# --- results.csv --------------------------------------------------------------------------------------------
TEXT_COLUMNS = {
    "text_stateful_word_validity": lambda job: value(job, "stateful", SEED_DECODER, "word_validity"),
    "text_stateless_word_validity": lambda job: value(job, "stateless", SEED_DECODER, "word_validity"),
    "text_reference_word_validity": lambda job: (bound(job, "reference", "word_validity") or (None,))[0],
    "text_stateful_greedy_loop_rate": lambda job: value(job, "stateful", "greedy", "loop_rate"),
    "text_stateless_greedy_loop_rate": lambda job: value(job, "stateless", "greedy", "loop_rate"),
    "text_stateful_line_shape": lambda job: value(job, "stateful", SEED_DECODER, "line_shape"),
    "text_stateful_copy_32": lambda job: value(job, "stateful", SEED_DECODER, "copy_32"),
}  # results.csv's text columns: the figures the findings read (the seed's decoder unless named)


# --- report.md ----------------------------------------------------------------------------------------------
def _settings_line(record: dict) -> str:
    s = record.get("settings") or {}
    seconds = finite(record.get("seconds"))
    return (f"{s.get('samples', '?')} samples of {s.get('chars', '?')} characters per setting, seed "
            f"{s.get('seed', '?')}; windowed: the last {s.get('window', '?')} tokens"
            + ("" if seconds is None else f"; measured in {seconds:.0f} s") + ".")


def _drift_table(record: dict) -> list[str]:
    drift = {mode: stretches for mode, stretches in (record.get("drift") or {}).items() if stretches}
    if not drift:
        return []
    s = record.get("settings") or {}
    lines = ["", f"Drift: {s.get('drift_samples', '?')} generations of {s.get('drift_chars', '?')} characters, "
             f"{s.get('drift_decoder', 'pure')} sampling; each stretch's statistics (all generations together).", "",
             "| characters | " + " | ".join(f"{mode} {name}" for mode in drift for name in DRIFT_SHOWN) + " |",
             "|---|" + "--:|" * (len(drift) * len(DRIFT_SHOWN))]
    for k in range(max(map(len, drift.values()))):
        first = next(stretches[k] for stretches in drift.values() if k < len(stretches))
        cells = [_cell(((stretches[k] if k < len(stretches) else {}).get("statistics") or {}).get(name))
                 for stretches in drift.values() for name in DRIFT_SHOWN]
        lines.append(f"| {first.get('start', '?')}–{first.get('end', '?')} | " + " | ".join(cells) + " |")
    return lines


def text_section(jobs, plots: dict[str, Path]) -> list[str]:
    """report.md's *Generated text* section: a table per run with a text record ([] when none has)."""
    shown = text_jobs(jobs)
    if not shown:
        return []
    lines = ["## Generated text", "",
             "The text each model writes, measured against the training split (docs/evaluation.md): for every "
             "inference mode × decoder, each statistic's mean over the samples ± one standard error; the same "
             "statistics of held-out validation text (reference), of uniform random strings (floor) and of a "
             "looped phrase (ceiling). Final weights.", ""]
    for job in shown:
        record = text_record(job)
        rows = text_rows(record)
        statistics = _ordered([name for _, figures in rows for name in figures], STATISTICS)
        lines += [f"### {run_label(job, jobs)}", "", _settings_line(record), "",
                  "| setting | " + " | ".join(statistics) + " |", "|---|" + "--:|" * len(statistics)]
        lines += [f"| {label} | " + " | ".join(_cell(figures.get(name)) for name in statistics) + " |"
                  for label, figures in rows]
        lines += _drift_table(record) + [""]
    lines += [f"![word validity and loop rate by mode and decoder, and the drift]({PLOT_TEXT})" if PLOT_TEXT in plots
              else f"{MISSING} no text figure.", ""]
    return lines


# --- the figure ---------------------------------------------------------------------------------------------
def _bars(ax, job, label: str, statistic: str) -> None:
    """Grouped bars: a group per decoder, a bar per mode (± se); the reference and the floor as lines."""
    record = text_record(job)
    modes = _ordered(record["modes"], TEXT_MODES)
    decoders = _ordered([d for mode in modes for d in (record["modes"][mode] or {})], DECODERS)
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        figures = [setting(job, mode, decoder, statistic) for decoder in decoders]
        xs = [x + (i - (len(modes) - 1) / 2) * width for x in range(len(decoders))]
        ax.bar(xs, [f[0] if f else 0.0 for f in figures], width, label=mode,
               yerr=[(f[1] or 0.0) if f else 0.0 for f in figures], capsize=2)
    for which, style in (("reference", "-"), ("floor", ":")):
        figure = bound(job, which, statistic)
        if figure is not None:
            ax.axhline(figure[0], color="black" if which == "reference" else "grey", linestyle=style, linewidth=1,
                       label=f"{BOUNDS[which]} {figure[0]:.3f}")
    ax.set_xticks(range(len(decoders)), [d.replace("_", " ") for d in decoders], fontsize=7, rotation=15)
    ax.set(title=f"{label}: {statistic}", ylabel=statistic)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room above the bars for the legend
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=6, ncol=3, loc="upper center")


def _drift(ax, job, label: str) -> None:
    """word_validity per stretch of the long generations, a line per mode; the reference as a line."""
    for mode, stretches in ((text_record(job) or {}).get("drift") or {}).items():
        points = [((s.get("start", 0) + s.get("end", 0)) / 2, _pair((s.get("statistics") or {}).get("word_validity")))
                  for s in stretches or []]
        points = [(x, figure) for x, figure in points if figure is not None]
        if points:
            ax.errorbar([x for x, _ in points], [f[0] for _, f in points], yerr=[f[1] or 0.0 for _, f in points],
                        marker="o", markersize=3, capsize=2, label=mode)
    reference = bound(job, "reference", "word_validity")
    if reference is not None:
        ax.axhline(reference[0], color="black", linewidth=1, label=f"reference {reference[0]:.3f}")
    ax.set(title=f"{label}: drift (word_validity per stretch)", xlabel="characters into the generation",
           ylabel="word_validity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def _has_drift(job) -> bool:
    return any((text_record(job) or {}).get("drift", {}).values())


def plot_text(jobs, path: Path) -> Path | None:
    """A row per run with a text record: word_validity and loop_rate by decoder and mode, and the drift."""
    shown = text_jobs(jobs)
    if not shown:
        return None
    plt = _figure()
    columns = len(SHOWN) + any(_has_drift(job) for job in shown)
    fig, axes = plt.subplots(len(shown), columns, figsize=(5.2 * columns, 3.6 * len(shown)), squeeze=False)
    for row, job in zip(axes, shown):
        for ax, statistic in zip(row, SHOWN):
            _bars(ax, job, run_label(job, jobs), statistic)
        if columns > len(SHOWN):
            if _has_drift(job):
                _drift(row[-1], job, run_label(job, jobs))
            else:
                row[-1].set_axis_off()
    fig.tight_layout()
    return _save(fig, path)
