"""The report's sections of the study's own figures, each a plot and its lines of report.md: the ladder,
the context curve, the modes over training, bits per character by mode and the learning curves."""

from pathlib import Path
from statistics import stdev

from gru_experiments.report.common import MISSING, cell, escape, finish, grouped_bars, image, save, subplots, table
from gru_experiments.report.section import Section
from gru_experiments.report.seed_groups import spread
from gru_experiments.report.sweep_folder import JobResult, ladder_jobs
from gru_experiments.study.cost import duration
from gru_experiments.study.evaluation import FIGURES, curve_points
from gru_experiments.study.modes import MODES, OVER_TRAINING_MODES, STATEFUL, STATELESS

PLOT_BPC, PLOT_CURVES = "bpc_by_mode.png", "curves.png"
PLOT_CONTEXT, PLOT_MODES = "context_curve.png", "modes_over_training.png"
PLOT_LADDER = "ladder.png"


def plot_ladder(jobs: list[JobResult], path: Path) -> Path | None:
    """Stateful and stateless bpc of every rung, the bigram baseline as a line."""
    rungs = [job for job in ladder_jobs(jobs) if job.number("stateful_bpc") is not None]
    if not rungs:
        return None
    fig, ax = subplots(figsize=(max(6.0, 0.9 * len(rungs) + 2), 4.2))
    modes = (STATEFUL, STATELESS)
    grouped_bars(ax, {mode: [job.number(f"{mode}_bpc") for job in rungs] for mode in modes},
                 errors={mode: [spread(job, f"{mode}_bpc") for job in rungs] for mode in modes})
    bigram = next((job.number("bigram_bpc") for job in rungs if job.number("bigram_bpc")), None)
    if bigram is not None:
        ax.axhline(bigram, color="gray", linestyle="--", linewidth=1, label=f"bigram counts ({bigram:.2f})")
    labels = [f"{job.model}\n{(job.number('parameters') or 0) / 1000:,.0f}k" for job in rungs]
    ax.set_xticks(range(len(rungs)), labels, fontsize=8)
    tallest = max(job.number(key) or 0.0 for job in rungs for key in ("stateful_bpc", "stateless_bpc"))
    ax.set_ylim(0, max(tallest, bigram or 0.0) * 1.25)  # room for the legend above the bars
    finish(ax, 8, "y", title="The ladder: validation bits per character (parameters or stored counts below; "
           "error bars: the sd between a setting's trainings)",
           ylabel="bits per character (lower is better)")
    return save(fig, path)


def plot_bpc_by_mode(jobs: list[JobResult], path: Path) -> Path | None:
    """Grouped bars: a group per model, a bar per inference mode (val bpc when no job has the modes)."""
    keys = [f"{mode}_bpc" for mode in FIGURES if any(job.number(f"{mode}_bpc") is not None for job in jobs)]
    labels = [key.removesuffix("_bpc") for key in keys]
    if not keys:
        keys, labels = ["val_bpc"], ["validation (windows, zero state)"]
    shown = [job for job in jobs if any(job.number(key) is not None for key in keys)]
    if not shown:
        return None
    fig, ax = subplots(figsize=(max(6.0, 1.3 * len(shown) + 2), 4.2))
    grouped_bars(ax, {label: [job.number(key) for job in shown] for key, label in zip(keys, labels)},
                 errors={label: [spread(job, key) for job in shown] for key, label in zip(keys, labels)})
    ax.set_xticks(range(len(shown)), [job.model for job in shown], rotation=20, ha="right")
    finish(ax, 8, "y", title="Validation bits per character by inference mode",
           ylabel="bits per character (lower is better)")
    return save(fig, path)


def plot_curves(jobs: list[JobResult], path: Path) -> Path | None:
    """Training loss and validation bpc against the training step, every model in one figure."""
    shown = [job for job in jobs if job.history]
    if not shown:
        return None
    fig, (train_ax, val_ax) = subplots(1, 2, figsize=(11, 4.2))
    for job in shown:
        status = "" if job.status == "completed" else f", {job.status}"
        label = f"{job.model} ({job.values.get('tokenizer') or '?'}){status}"
        for ax, metric in ((train_ax, "train/loss"), (val_ax, "val/bpc")):
            points = job.history.get(metric, [])
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 12 else None, markersize=3, label=label)
    finish(train_ax, 7, title="Training loss", xlabel="step", ylabel="nats per token (char or subword)")
    val_ax.set(title="Validation", xlabel="step", ylabel="bits per character")
    val_ax.grid(alpha=0.3)
    return save(fig, path)


def context_curve_series(jobs: list[JobResult]) -> dict[str, dict]:
    """{model: {"windows": [(w, bpc), ...], "stateful": bpc, "band": [(w, sd), ...]}} of every completed model
    but the n-grams; the band is the sd between a setting's trainings at each w (empty for one training)."""
    return {job.model: {"windows": [(int(key), value) for key, value in points if key.isdigit()],
                        STATEFUL: dict(points).get(STATEFUL), "band": _curve_spread(job)}
            for job in jobs if job.status == "completed" and job.values.get("family") != "ngram"
            and (points := curve_points(job.values.get("context_curve")))}


def _curve_spread(job: JobResult) -> list[tuple[int, float]]:
    """[(w, the sd of bpc at w between the setting's trainings)], where every training has the point."""
    if job.n < 2:
        return []
    curves = [dict(curve_points(run.values.get("context_curve"))) for run in job.runs]
    shared = [key for key in curves[0] if key.isdigit() and all(isinstance(c.get(key), float) for c in curves)]
    return [(int(key), stdev(c[key] for c in curves)) for key in shared]


def baselines(jobs: list[JobResult]) -> dict[str, float]:
    """The context curve's horizontal lines: the bigram counts per tokenizer and the best n-gram model."""
    lines = {}
    for job in jobs:
        if job.status == "completed" and job.number("bigram_bpc") is not None:
            lines.setdefault(f"bigram counts ({job.values.get('tokenizer') or '?'})", job.number("bigram_bpc"))
    ngrams = [job for job in jobs if job.status == "completed" and job.values.get("family") == "ngram"
              and job.number("stateful_bpc") is not None]
    if ngrams:
        best = min(ngrams, key=lambda job: job.number("stateful_bpc"))
        lines[f"best n-gram ({best.model})"] = best.number("stateful_bpc")
    return lines


def plot_context_curve(jobs: list[JobResult], path: Path) -> Path | None:
    """Bits per character against the context (log axis), a curve per model; the baselines as lines."""
    series = context_curve_series(jobs)
    if not series:
        return None
    return save_curves(path, {model: (s["windows"], s[STATEFUL]) for model, s in series.items()},
                       "Bits per character against the context given (final weights; band: ± the sd between "
                       "a setting's trainings)", "tokens of context (from the initial state); stateful: the state "
                       "carried", baselines(jobs), ticks=True, bands={model: s["band"] for model, s in series.items()})


def curve_to_stateful(ax, xs, ys, stateful: float | None, stateful_x: float, **style) -> None:
    """A context curve, then a dotted line from its last point to its stateful figure, a star at `stateful_x`."""
    (line,) = ax.plot(xs, ys, marker="o", markersize=3, **style)
    if stateful is not None:
        ax.plot([xs[-1], stateful_x], [ys[-1], stateful], linestyle=":", color=line.get_color())
        ax.plot([stateful_x], [stateful], marker="*", markersize=9, color=line.get_color())


def save_curves(path: Path, curves: dict, title: str, xlabel: str, baselines: dict | None = None, ticks=False,
                bands: dict | None = None) -> Path:
    """Context curves ({label: ([(context, bpc), ...], stateful bpc)}) on a log2 axis, each with its stateful
    figure at 4x the longest context; `baselines` ({label: bpc}) as lines; `ticks`: a tick at each context;
    `bands` ({label: [(context, sd), ...]}) shades ± sd about a curve."""
    fig, ax = subplots(figsize=(7.5, 4.5))
    contexts = sorted({x for points, _ in curves.values() for x, _ in points})
    for label, (points, stateful) in curves.items():
        xs, ys = zip(*points)
        curve_to_stateful(ax, xs, ys, stateful, contexts[-1] * 4, label=label)
        if band := dict((bands or {}).get(label) or []):
            shaded = [(x, y, band[x]) for x, y in points if x in band]
            ax.fill_between([x for x, _, _ in shaded], [y - sd for _, y, sd in shaded],
                            [y + sd for _, y, sd in shaded], alpha=0.2, color=ax.lines[-1].get_color())
    for (label, value), style in zip((baselines or {}).items(), ["--", "-.", ":", "--"]):
        ax.axhline(value, linestyle=style, color="grey", linewidth=1, label=f"{label} {value:.3f}")
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks([*contexts, contexts[-1] * 4], [*(str(x) for x in contexts), STATEFUL])
    finish(ax, 7, title=title, xlabel=xlabel, ylabel="bits per character (lower is better)")
    return save(fig, path)


def modes_over_training_series(jobs: list[JobResult]) -> dict[str, dict]:
    """{model: {"stateful": [(tokens, bpc), ...], "stateless": [...]}} from history.csv, tokens = step x
    the run's tokens per step (the step itself when unknown)."""
    series = {}
    for job in jobs:
        tokens, steps = job.number("train_tokens"), job.number("train_steps")
        if steps == 0:  # a counted model (n-gram): one validation, no training to plot
            continue
        per_step = tokens / steps if tokens and steps else 1.0
        curves = {mode: [(step * per_step, value) for step, value in job.history.get(f"val/{mode}_bpc", [])]
                  for mode in OVER_TRAINING_MODES}
        if any(curves.values()):
            series[job.model] = curves
    return series


def plot_modes_over_training(jobs: list[JobResult], path: Path) -> Path | None:
    """Stateful (solid) and stateless (dashed) validation bpc against training tokens, per model."""
    series = modes_over_training_series(jobs)
    if not series:
        return None
    fig, ax = subplots(figsize=(7.5, 4.5))
    for model, curves in series.items():
        color = None
        for mode, style in ((STATEFUL, "-"), (STATELESS, "--")):
            if curves[mode]:
                xs, ys = zip(*curves[mode])
                (line,) = ax.plot(xs, ys, linestyle=style, marker="o" if len(xs) < 12 else None, markersize=3,
                                  color=color, label=f"{model} {mode}")
                color = line.get_color()
    finish(ax, 7, title="Inference modes over training", xlabel="training tokens", ylabel="bits per character")
    return save(fig, path)


# --- their sections of report.md --------------------------------------------------------------------------
def _context(job: JobResult) -> str:
    return (MISSING if "context" not in job.values else "unbounded" if job.values["context"] is None
            else f"{job.values['context']:,}")


def ladder_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    rows = [[escape(job.model), escape(str(job.values.get("family") or MISSING)), _context(job),
             cell(job.number("parameters"), "{:,}".format),
             *(cell(job.number(f"{mode}_bpc"), "{:.4f}".format) for mode in MODES),
             cell(job.number("train_seconds"), duration)] for job in ladder_jobs(jobs)]
    if not rows:
        return []
    lines = ["", "## The ladder", "",
             "Each model family side by side: validation bits per character with the state carried (stateful) "
             "and reset at every step (stateless: only the last token is seen), and with the last "
             "`evaluation.window` tokens (windowed). Parameters: trainable ones; for an n-gram, the counts it "
             "stores. Training time: the training steps alone; for an n-gram, counting the training split.", "",
             *table(["model", "family", "context (tokens)", "parameters", "stateful bpc", "stateless bpc",
                     "windowed bpc", "training time"], rows, "llr")]
    bigram = next((job.number("bigram_bpc") for job in ladder_jobs(jobs) if job.number("bigram_bpc")), None)
    if bigram is not None:
        lines += ["", f"Baseline: the add-one bigram table of the training split, {bigram:.4f} bits per character."]
    return lines + ["", image("the ladder: stateful and stateless bits per character", PLOT_LADDER, plots,
                              "no ladder plot.")]


def figure_section(name: str, plot_file: str, plot, heading: str, intro: str | None, alt: str, missing: str) -> Section:
    """A section that is one figure: its heading, what the figure shows (where `intro` says) and the image."""
    return Section(name, lambda jobs, plots: [f"## {heading}", "", *([intro, ""] if intro else []),
                                              image(alt, plot_file, plots, missing), ""], plots={plot_file: plot})


LADDER = Section("ladder", ladder_section, plots={PLOT_LADDER: plot_ladder})
CONTEXT = figure_section(
    "context curve", PLOT_CONTEXT, plot_context_curve, "Context curve",
    "Bits per character with the model given only the last w tokens, from its initial state (w = 1 is the stateless "
    "figure), and with the state carried through the whole split (stateful, at the right); final weights. The points "
    "score the windowed figure's targets (all, or its systematic sample; summary.json's context_curve.settings says "
    "which, with standard errors; docs/evaluation.md).",
    "bits per character against context length", "no completed job has a context curve.")
MODES_OVER_TRAINING = figure_section(
    "modes over training", PLOT_MODES, plot_modes_over_training, "Inference modes over training",
    "Stateful and stateless bits per character of the whole validation split at every validation (history.csv), "
    "against the training tokens.",
    "stateful and stateless bits per character over training", "no job recorded the modes over training.")
BPC = figure_section("bits per character by mode", PLOT_BPC, plot_bpc_by_mode, "Bits per character by inference mode",
                     None, "bits per character by model and inference mode", "no completed job has a bpc to plot.")
CURVES = figure_section("learning curves", PLOT_CURVES, plot_curves, "Learning curves", None,
                        "training loss and validation bpc against training steps", "no job wrote history.csv.")
