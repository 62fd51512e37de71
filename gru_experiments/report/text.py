"""The generated text measured (summary.json's "text", study/text_protocol.py): report.md's *Generated
text* section, results.csv's text columns, `text_statistics.png` and the findings on the generated text.
A run's record: per inference mode × decoder, each statistic ± se; the same of held-out text (reference),
random strings (floor) and a looped phrase (ceiling); and, where drawn, the drift of long generations.
"""

from pathlib import Path

from gru_experiments.report.common import finish, finite, image, ordered, plus_minus, save, subplots, table
from gru_experiments.report.section import Findings, Record, Section, cannot, verdict
from gru_experiments.report.significance import Difference, difference, side
from gru_experiments.report.sweep_folder import run_label
from gru_experiments.study.modes import MODES_BY_CONTEXT, STATEFUL, STATELESS
from gru_experiments.study.text_protocol import DECODERS, DRIFT_SHOWN
from gru_experiments.study.text_stats import STATISTICS

ORIGINAL_DECODER = "temperature_0.8"  # the original study's decoder: the one the findings and results.csv read
BOUNDS = {"reference": "reference (validation)", "floor": "random (floor)", "ceiling": "looped (ceiling)"}
PLOT_TEXT = "text_statistics.png"
SHOWN = ("word_validity", "loop_rate")  # the figure's bar panels


# --- reading the record -------------------------------------------------------------------------------------
text_record = Record(("text",), holding="modes")
text_jobs = text_record.jobs


def _pair(entry) -> tuple[float, float | None] | None:
    """(value, standard error or None) of a {"value", "se"} entry; None without a finite value."""
    if not isinstance(entry, dict) or finite(entry.get("value")) is None:
        return None
    return finite(entry["value"]), finite(entry.get("se"))


def setting(job, mode: str, statistic: str, decoder: str = ORIGINAL_DECODER) -> tuple[float, float | None] | None:
    """(value, se) of one statistic of the samples of one mode and decoder."""
    record = text_record(job) or {}
    return _pair(((record.get("modes", {}).get(mode) or {}).get(decoder) or {}).get(statistic))


def bound(job, which: str, statistic: str) -> tuple[float, float | None] | None:
    """(value, se) of the reference's, the floor's or the ceiling's statistic (`which`)."""
    return _pair(((text_record(job) or {}).get(which) or {}).get(statistic))


def value(job, mode: str, statistic: str, decoder: str = ORIGINAL_DECODER) -> float | None:
    figure = setting(job, mode, statistic, decoder)
    return None if figure is None else figure[0]


def text_rows(record: dict) -> list[tuple[str, dict]]:
    """(label, {statistic: entry}) per mode × decoder, then the reference, the floor and the ceiling."""
    rows = []
    for mode in ordered(record["modes"], MODES_BY_CONTEXT):
        by_decoder = record["modes"][mode] or {}
        rows += [(f"{mode}, {decoder}", by_decoder[decoder] or {}) for decoder in ordered(by_decoder, DECODERS)]
    return rows + [(label, record.get(which) or {}) for which, label in BOUNDS.items()]


def _cell(entry) -> str:
    return plus_minus(*(_pair(entry) or (None, None)))


# --- results.csv --------------------------------------------------------------------------------------------
TEXT_COLUMNS = {
    "text_stateful_word_validity": lambda job: value(job, STATEFUL, "word_validity"),
    "text_stateless_word_validity": lambda job: value(job, STATELESS, "word_validity"),
    "text_reference_word_validity": lambda job: (bound(job, "reference", "word_validity") or (None,))[0],
    "text_stateful_greedy_loop_rate": lambda job: value(job, STATEFUL, "loop_rate", "greedy"),
    "text_stateless_greedy_loop_rate": lambda job: value(job, STATELESS, "loop_rate", "greedy"),
    "text_stateful_line_shape": lambda job: value(job, STATEFUL, "line_shape"),
    "text_stateful_copy_32": lambda job: value(job, STATEFUL, "copy_32"),
}  # results.csv's text columns: the figures the findings read (the original study's decoder unless named)


# --- report.md ----------------------------------------------------------------------------------------------
def _settings_line(job) -> str:
    record = text_record(job)
    s = record.get("settings") or {}
    seconds = finite(record.get("seconds"))
    seeds = [((text_record(run) or {}).get("settings") or {}).get("seed", "?") for run in job.runs]  # each training's
    return (f"{s.get('samples', '?')} samples of {s.get('chars', '?')} characters per setting, "
            f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}; "
            f"windowed: the last {s.get('window', '?')} tokens"
            + ("" if seconds is None else f"; measured in {seconds:.0f} s") + ".")


def _drift_table(record: dict) -> list[str]:
    drift = {mode: stretches for mode, stretches in (record.get("drift") or {}).items() if stretches}
    if not drift:
        return []
    s = record.get("settings") or {}
    lines = ["", f"Drift: {s.get('drift_samples', '?')} generations of {s.get('drift_chars', '?')} characters, "
             f"{s.get('drift_decoder', 'pure')} sampling; each stretch's statistics (all generations together).", ""]
    rows = []
    for k in range(max(map(len, drift.values()))):
        first = next(stretches[k] for stretches in drift.values() if k < len(stretches))
        rows.append([f"{first.get('start', '?')}–{first.get('end', '?')}"]
                    + [_cell(((stretches[k] if k < len(stretches) else {}).get("statistics") or {}).get(name))
                       for stretches in drift.values() for name in DRIFT_SHOWN])
    header = ["characters", *(f"{mode} {name}" for mode in drift for name in DRIFT_SHOWN)]
    return lines + table(header, rows, "lr")


def text_section(jobs, plots: dict[str, Path]) -> list[str]:
    """A table per run with a text record."""
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
        statistics = ordered([name for _, figures in rows for name in figures], STATISTICS)
        lines += [f"### {run_label(job, jobs)}", "", _settings_line(job), ""]
        lines += table(["setting", *statistics], [[label, *(_cell(figures.get(name)) for name in statistics)]
                                                  for label, figures in rows], "lr")
        lines += _drift_table(record) + [""]
    lines += [image("word validity and loop rate by mode and decoder, and the drift", PLOT_TEXT, plots,
                    "no text figure."), ""]
    return lines


# --- the figure ---------------------------------------------------------------------------------------------
def _bars(ax, job, label: str, statistic: str) -> None:
    """Grouped bars: a group per decoder, a bar per mode (± se); the reference and the floor as lines."""
    record = text_record(job)
    modes = ordered(record["modes"], MODES_BY_CONTEXT)
    decoders = ordered([d for mode in modes for d in (record["modes"][mode] or {})], DECODERS)
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        figures = [setting(job, mode, statistic, decoder) for decoder in decoders]
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
    finish(ax, 6, title=f"{label}: drift (word_validity per stretch)", xlabel="characters into the generation",
           ylabel="word_validity")


def _has_drift(job) -> bool:
    return any((text_record(job) or {}).get("drift", {}).values())


def plot_text(jobs, path: Path) -> Path | None:
    """A row per run with a text record: word_validity and loop_rate by decoder and mode, and the drift."""
    shown = text_jobs(jobs)
    if not shown:
        return None
    columns = len(SHOWN) + any(_has_drift(job) for job in shown)
    fig, axes = subplots(len(shown), columns, figsize=(5.2 * columns, 3.6 * len(shown)), squeeze=False)
    for row, job in zip(axes, shown):
        for ax, statistic in zip(row, SHOWN):
            _bars(ax, job, run_label(job, jobs), statistic)
        if columns > len(SHOWN):
            if _has_drift(job):
                _drift(row[-1], job, run_label(job, jobs))
            else:
                row[-1].set_axis_off()
    fig.tight_layout()
    return save(fig, path)


# --- the findings -------------------------------------------------------------------------------------------
TEXT = Findings("Findings on the generated text", "What the text the models write shows (*Generated text*).")
# Every figure is a mean over the samples of a setting ± one standard error (study/text_stats.py).
LOOPING = 0.5  # greedy "loops" when at least this share of its samples end in a repeated phrase
LINE_SLACK = 0.05  # KS distance: how far above the reference's own line_shape still counts as the corpus's shape
LARGE = 1_000_000  # parameters: the least for "a large model"
NO_TEXT = "no completed job with the text statistics (summary.json's text)"


def text_figure(source: str, statistic: str, less: float = 0.0):
    """A `figure` for significance.side: one training's statistic (value less `less`, se) of the samples of mode
    `source` (decoder ORIGINAL_DECODER), or of the reference, the floor or the ceiling (`source` one of BOUNDS)."""
    def figure(job):
        found = bound(job, source, statistic) if source in BOUNDS else setting(job, source, statistic)
        return None if found is None else (found[0] - less, found[1])
    return figure


def gap(job, a: str, b: str, statistic: str, less: float = 0.0) -> Difference | None:
    """a's statistic less `less` - b's over the job's trainings (a and b: modes or BOUNDS), by the report's rule."""
    return difference(side(job, text_figure(a, statistic, less)), side(job, text_figure(b, statistic)))


@TEXT.claim("Greedy decoding loops whatever the mode")
def greedy_loop_finding(jobs) -> tuple[str, str]:
    """Does greedy decoding end in a loop in every inference mode (loop_rate >= LOOPING)?"""
    parts, looping, judged = [], 0, 0
    for job in text_jobs(jobs):
        rates = {mode: figure for mode in MODES_BY_CONTEXT
                 if (figure := setting(job, mode, "loop_rate", "greedy")) is not None}
        if not rates:
            continue
        judged += len(rates)
        looping += sum(figure[0] >= LOOPING for figure in rates.values())
        reference = bound(job, "reference", "loop_rate")
        parts.append(f"{job.model}: " + ", ".join(f"{mode} {plus_minus(*figure)}" for mode, figure in rates.items())
                     + (f" (reference {plus_minus(*reference)})" if reference else ""))
    if not judged:
        return cannot(NO_TEXT + " and greedy samples")
    evidence = ("Greedy decoding's loop_rate (the share of samples ending in a repeated phrase): " + "; ".join(parts)
                + f". Rule: greedy loops in a mode when its loop_rate is at least {LOOPING}; supported when it does in "
                f"every mode of every model. It does in {looping} of {judged} (model, mode) settings.")
    return (verdict(looping, judged), evidence)


@TEXT.claim("Stateless text is noise")
def stateless_noise_finding(jobs) -> tuple[str, str]:
    """Are stateless samples' words far rarer in the corpus than stateful samples' and the reference's?"""
    parts, noise = [], 0
    for job in text_jobs(jobs):
        stateless, stateful = (setting(job, mode, "word_validity") for mode in (STATELESS, STATEFUL))
        reference = bound(job, "reference", "word_validity")
        if stateless is None or stateful is None or reference is None:
            continue
        gaps = [gap(job, other, STATELESS, "word_validity") for other in (STATEFUL, "reference")]
        noise += all(found.above for found in gaps)
        floor = bound(job, "floor", "word_validity")
        parts.append(f"{job.model}: stateless {plus_minus(*stateless)}, stateful {plus_minus(*stateful)} (gap "
                     f"{gaps[0].text(3)}), reference {plus_minus(*reference)} (gap {gaps[1].text(3)})"
                     + (f", random floor {floor[0]:.3f}" if floor else ""))
    if not parts:
        return cannot(NO_TEXT + " and the stateless, stateful and reference word_validity")
    evidence = (f"word_validity (the share of a sample's words found in the training split), decoder "
                f"{ORIGINAL_DECODER}: " + "; ".join(parts) + ". Rule: supported for a model when stateless is below "
                "both stateful and the reference by more than two standard errors of the difference (hypot of the "
                f"two; over seeds: the spread between trainings). It is for {noise} of {len(parts)} models.")
    return (verdict(noise, len(parts)), evidence)


@TEXT.claim("Stateful text keeps the corpus's line shape")
def line_shape_finding(jobs) -> tuple[str, str]:
    """Is stateful text's line-length distribution as close to the corpus's as held-out text is?"""
    parts, kept = [], 0
    for job in text_jobs(jobs):
        stateful = setting(job, STATEFUL, "line_shape")
        reference = bound(job, "reference", "line_shape")
        if stateful is None or reference is None:
            continue
        beyond = gap(job, STATEFUL, "reference", "line_shape", less=LINE_SLACK)  # above: beyond the limit
        limit = reference[0] + LINE_SLACK + beyond.threshold  # the stateful figure that beyond.above passes
        kept += not beyond.above
        part = (f"{job.model}: stateful {plus_minus(*stateful)} against the reference's {plus_minus(*reference)} "
                f"(limit {limit:.3f}: {'beyond' if beyond.above else 'within'})")
        stateless = setting(job, STATELESS, "line_shape")
        if stateless is not None:
            part += f", stateless {plus_minus(*stateless)} ({'within' if stateless[0] <= limit else 'beyond'})"
        parts.append(part)
    if not parts:
        return cannot(NO_TEXT + " and the stateful and reference line_shape")
    evidence = (f"line_shape (the Kolmogorov–Smirnov distance of the samples' line lengths from the reference's; the "
                f"reference's own: against other validation slices), decoder {ORIGINAL_DECODER}: " + "; ".join(parts)
                + f". Rule: supported for a model when stateful's is at most the reference's + {LINE_SLACK} + two "
                f"standard errors of the difference. It is for {kept} of {len(parts)} models.")
    return (verdict(kept, len(parts)), evidence)


def _first_last(job) -> tuple | None:
    stateful = job.history.get("val/stateful_word_validity") or []
    stateless = job.history.get("val/stateless_word_validity") or []
    if not stateful or not stateless or finite(stateful[0][1]) is None or finite(stateless[-1][1]) is None:
        return None
    return stateful[0], stateless[-1]


@TEXT.claim("Stateful text at the first validation beats stateless text at the last")
def early_stateful_finding(jobs) -> tuple[str, str]:
    """(The original study's lesson 3, in words.) Does the stateful text of the first validation have more valid words
    than the stateless text of the last?"""
    judged = [(job, pair) for job in jobs if job.recurrent
              and getattr(job, "history", None) and (pair := _first_last(job)) is not None]
    if not judged:
        return cannot("history.csv's val/stateful_word_validity and val/stateless_word_validity for a "
                      "recurrent model")
    early = sum(first[1] > last[1] for _, (first, last) in judged)
    parts = [f"{job.model} {first[1]:.3f} at step {first[0]} vs {last[1]:.3f} at step {last[0]}"
             for job, (first, last) in judged]
    evidence = ("word_validity of a short sample at every validation (history.csv), stateful at the first against "
                "stateless at the last: " + "; ".join(parts) + f". Rule: supported for a model when the first "
                f"stateful figure is the higher (one sample each: no standard error). It is for {early} of "
                f"{len(judged)} recurrent models.")
    return (verdict(early, len(judged)), evidence)


@TEXT.claim("A large model copies its training text")
def copying_finding(jobs) -> tuple[str, str]:
    """Does the sweep's largest model (at least LARGE parameters) reproduce 32-character spans of its training
    text more often than held-out text happens to?"""
    judged = [job for job in text_jobs(jobs) if (finite(job.values.get("parameters")) or 0) >= LARGE
              and setting(job, STATEFUL, "copy_32") and bound(job, "reference", "copy_32")]
    if not judged:
        return cannot(f"a model of at least {LARGE:,} parameters with the text statistics' copy_32 "
                      f"(e.g. leviathan)")
    large = max(judged, key=lambda job: finite(job.values.get("parameters")))
    copied, reference = setting(large, STATEFUL, "copy_32"), bound(large, "reference", "copy_32")
    excess = gap(large, STATEFUL, "reference", "copy_32")
    evidence = (f"copy_32 (the share of a sample's 32-character spans found verbatim in the training split), stateful, "
                f"decoder {ORIGINAL_DECODER}: the largest model, {large.model} "
                f"({finite(large.values.get('parameters')):,.0f} parameters), {plus_minus(*copied)} against the "
                f"reference's {plus_minus(*reference)} (held-out text: chance overlaps), excess {excess.text(3)}")
    others = [job for job in text_jobs(jobs) if job is not large and setting(job, STATEFUL, "copy_32")]
    if others:
        evidence += "; the others: " + ", ".join(f"{job.model} {value(job, STATEFUL, 'copy_32'):.3f}"
                                                 for job in others)
    evidence += (". Rule: supported when the largest model's copy_32 exceeds the reference's by more than two "
                 "standard errors of the difference.")
    return ("supported" if excess.above else "not shown by this sweep", evidence)


SECTION = Section("generated text", text_section, columns=TEXT_COLUMNS, plots={PLOT_TEXT: plot_text}, findings=TEXT)
