"""The study's report over a sweep folder: results.csv, report.md and PNG plots, and a W&B
summary run that carries the same table and plots.

A sweep folder holds one folder per job (Hydra's multirun layout); everything is read from
what the jobs wrote there:

    <job>/.hydra/config.yaml   what the job was asked to train (model, cell, tokenizer, logger)
    <job>/summary.json         its results, or status "failed" and the error
    <job>/history.csv          its learning curves (gru_experiments/history.py)
    <job>/samples.json         stateful and stateless samples for the study's prompts
    multirun.yaml              the sweep's overrides, hence the models it was meant to train

Nothing is recomputed, so building the report is cheap, can run while jobs are still going,
and gives the same files every time it runs over the same folder.
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import NoResultsError
from gru_experiments.evaluation import FIGURES, MODES, curve_points
from gru_experiments.files import atomic_file, atomic_write
from gru_experiments.findings import findings_markdown
from gru_experiments.history import read_history
from gru_experiments.runs import RunDir
from gru_experiments.training_grid import PLOT_GRID, grid_section, plot_training_grid

RESULTS_CSV, REPORT_MD = "results.csv", "report.md"
PLOT_BPC, PLOT_CURVES = "bpc_by_mode.png", "curves.png"
PLOT_CONTEXT, PLOT_MODES = "context_curve.png", "modes_over_training.png"
PLOT_LADDER = "ladder.png"

# (column, header in report.md, format); results.csv has every column of COLUMNS.
TABLE = [
    ("model", "model", str), ("training_mode", "training", str), ("cell", "cell", str),
    ("tokenizer", "tokenizer", str),
    ("parameters", "parameters", "{:,}".format),
    ("train_loss", "train loss", "{:.4f}".format), ("val_loss", "val loss", "{:.4f}".format),
    ("val_bpc", "val bpc", "{:.4f}".format),
    *((f"{mode}_bpc", f"{mode} bpc", "{:.4f}".format) for mode in FIGURES),
    ("tokens_per_second", "tokens/s", "{:,.0f}".format),
    ("wall_seconds", "wall time", lambda s: format_duration(s)),
    ("status", "status", str),
]
BEST_KEYS = ["val_bpc", *(f"{mode}_bpc" for mode in MODES)]  # summary["best"]: the best checkpoint's figures
COLUMNS = ["job", *(key for key, _, _ in TABLE), *(f"{mode}_nll" for mode in FIGURES), "state_gain_bpc",
           "state_gain_se", "best_step",
           *(f"best_{key}" for key in BEST_KEYS), "error", "run_dir"]
MISSING = "—"


@dataclass
class JobResult:
    job: str  # the job folder's name, e.g. "0_astra_alpha" ("" for a job that never started)
    status: str  # completed | failed | incomplete (started, no summary yet) | missing (never started)
    values: dict = field(default_factory=dict)  # summary.json, completed with what the config says
    run_dir: Path | None = None
    history: dict = field(default_factory=dict)  # {metric: [(step, value), ...]}
    samples: dict | None = None
    logger: dict = field(default_factory=dict)  # the job's logger config (_target_, project, group)

    @property
    def name(self) -> str:
        """The model's config name."""
        return self.values.get("model") or self.job

    @property
    def training_mode(self) -> str:
        return self.values.get("training_mode") or "windows"

    @property
    def model(self) -> str:
        """Its label in the report: the name, marked when trained with the state carried."""
        return f"{self.name} (streams)" if self.training_mode == "streams" else self.name

    def best(self, key: str) -> float | None:
        """A finite number of the best checkpoint (summary["best"]; key "step" for its step), else None."""
        best = self.values.get("best")
        value = best.get(key) if isinstance(best, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return value

    def number(self, key: str) -> float | None:
        """A finite number from the summary, else None."""
        value = self.values.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return value


@dataclass
class Report:
    sweep_dir: Path
    jobs: list[JobResult]
    overrides: list[str]
    files: dict[str, Path]  # name -> written file

    @property
    def completed(self) -> list[JobResult]:
        return [job for job in self.jobs if job.status == "completed"]

    @property
    def problems(self) -> list[JobResult]:
        return [job for job in self.jobs if job.status != "completed"]


# --- reading a sweep folder --------------------------------------------------------------
def _select(cfg, key: str):
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def sweep_overrides(sweep_dir: Path) -> list[str]:
    """The command-line overrides the sweep ran with (Hydra's multirun.yaml), [] if unknown."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return []
    return list(_select(OmegaConf.load(path), "hydra.overrides.task") or [])


def planned_models(overrides: list[str]) -> list[str]:
    """The models a sweep was started with, from its `model=a,b,c` override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides([o for o in overrides if o.startswith("model=")]):
        if override.is_sweep_override():
            return list(override.sweep_string_iterator())
        return [override.get_value_element_as_str()]
    return []


def read_job(job_dir: Path) -> JobResult:
    run = RunDir(job_dir)
    cfg = run.config()
    summary = run.summary()
    values = {
        "model": _select(cfg, "model.name"),
        "cell": _select(cfg, "model.architecture.cell"),
        "tokenizer": _select(cfg, "tokenizer.kind"),
        "training_mode": _select(cfg, "training.batching"),
        **(summary if isinstance(summary, dict) else {}),
    }
    if not isinstance(summary, dict):
        status = "incomplete"
    elif summary.get("status") == "failed":
        status = "failed"
    else:
        status = "completed"
    logger = {key: _select(cfg, f"logger.{key}") for key in ("_target_", "project", "group")}
    return JobResult(job=job_dir.name, status=status, values=values, run_dir=job_dir,
                     history=read_history(run.history_file), samples=run.samples(), logger=logger)


def _job_order(job_dir: Path) -> tuple:
    num = _select(OmegaConf.load(job_dir / ".hydra" / "hydra.yaml"), "hydra.job.num") \
        if (job_dir / ".hydra" / "hydra.yaml").is_file() else None
    return (num if isinstance(num, int) else math.inf, job_dir.name)


def collect(sweep_dir: Path) -> tuple[list[JobResult], list[str]]:
    """Every job of the sweep, in launch order, plus a "missing" entry for each planned model
    that has no job folder at all; and the sweep's overrides."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise NoResultsError(f"{sweep_dir} is not a folder: give the sweep folder (hydra.sweep.dir) of a study")
    job_dirs = sorted((p.parent.parent for p in sweep_dir.glob("**/.hydra/config.yaml") if p.parent.parent != sweep_dir),
                      key=_job_order)
    jobs = [read_job(job_dir) for job_dir in job_dirs]
    overrides = sweep_overrides(sweep_dir)
    started = {job.name for job in jobs}
    jobs += [JobResult(job="", status="missing", values={"model": name})
             for name in planned_models(overrides) if name not in started]
    if not any(job.status in ("completed", "failed") for job in jobs):
        found = f"{len(job_dirs)} job folders, none with a summary.json" if job_dirs else "no job folders"
        raise NoResultsError(f"no results in {sweep_dir}: {found}. Give the folder of a sweep "
                             f"(python sweep.py ..., or python train.py -m ...) whose jobs have finished.")
    return jobs, overrides


# --- writing ----------------------------------------------------------------------------
def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _cell(job: JobResult, key: str, fmt) -> str:
    value = job.values.get(key)
    if key in ("model", "training_mode", "cell", "tokenizer", "status"):
        value = {"status": job.status, "model": job.model}.get(key, value)
        if key == "training_mode" and job.status != "missing":
            value = job.training_mode  # summaries written before the choice existed: windows
        return _escape(str(value)) if value else MISSING
    number = job.number(key)
    return MISSING if number is None else fmt(number)


def _escape(text: str) -> str:
    """Text safe inside a markdown table cell (line breaks kept as <br>)."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def results_csv(jobs: list[JobResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in jobs:
        row = []
        for key in COLUMNS:
            if key == "job":
                value = job.job
            elif key == "status":
                value = job.status
            elif key == "run_dir":
                value = job.run_dir or ""
            elif key.startswith("best_"):
                value = job.best(key.removeprefix("best_"))
            else:
                value = job.values.get(key)
            row.append("" if value is None else repr(value) if isinstance(value, float) else value)
        writer.writerow(row)
    return out.getvalue()


def _missing_lines(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    lines = []
    for job in jobs:
        if job.status == "failed":
            error = str(job.values.get("error") or "no error recorded").strip().splitlines()[0]
            lines.append(f"- **{job.model}** failed (`{job.job}`): {_escape(error)}")
        elif job.status == "incomplete":
            lines.append(f"- **{job.model}** has no summary yet (`{job.job}`): still running, or stopped "
                         f"before it finished (killed, out of memory)")
        elif job.status == "missing":
            lines.append(f"- **{job.model}** was planned but never started")
    completed = [job for job in jobs if job.status == "completed"]
    absent: dict[tuple, list[str]] = {}  # the models without a metric -> the metrics they lack
    for key in ["val_bpc", *(f"{mode}_bpc" for mode in FIGURES)]:
        without = tuple(job.model for job in completed if job.number(key) is None)
        if without:
            absent.setdefault(without, []).append(f"`{key}`")
    for without, keys in absent.items():
        lines.append(f"- {', '.join(keys)} {'is' if len(keys) == 1 else 'are'} not in the summary of: "
                     f"{', '.join(without)}")
    for what, has in [("samples (samples.json)", lambda j: j.samples is not None),
                      ("learning curves (history.csv)", lambda j: bool(j.history))]:
        without = [job.model for job in completed if not has(job)]
        if without:
            lines.append(f"- no {what} for: {', '.join(without)}")
    if completed and PLOT_BPC not in plots:
        lines.append("- no bits-per-character plot: no completed job has a bpc")
    return lines


def _samples_section(jobs: list[JobResult]) -> list[str]:
    lines = ["## Samples: stateful vs stateless", "",
             "The same weights sampled with the hidden state carried across steps (stateful) and reset "
             "to zero at every step (stateless).", ""]
    with_samples = [job for job in jobs if job.samples is not None]
    if not with_samples:
        return lines + [f"{MISSING} no job wrote samples.json.", ""]
    for job in with_samples:
        samples = job.samples
        prompts = list(samples.get("prompts") or [])
        stateful, stateless = list(samples.get("stateful") or []), list(samples.get("stateless") or [])
        lines += [f"### {job.model}", "", "| prompt | stateful | stateless |", "|---|---|---|"]
        for i, prompt in enumerate(prompts):
            pick = lambda texts: _escape(str(texts[i])) if i < len(texts) and texts[i] is not None else MISSING  # noqa: E731
            lines.append(f"| `{_escape(str(prompt)).strip()}` | {pick(stateful)} | {pick(stateless)} |")
        if samples.get("settings"):
            settings = ", ".join(f"{k}={v}" for k, v in samples["settings"].items())
            lines += ["", f"Settings: {_escape(settings)}"]
        lines.append("")
    without = [job.model for job in jobs if job.status == "completed" and job.samples is None]
    if without:
        lines += [f"No samples for: {', '.join(without)}.", ""]
    return lines


def report_markdown(sweep_dir: Path, jobs: list[JobResult], overrides: list[str], plots: dict[str, Path]) -> str:
    counts = {status: sum(job.status == status for job in jobs)
              for status in ("completed", "failed", "incomplete", "missing")}
    total_seconds = sum(job.number("wall_seconds") or 0.0 for job in jobs)
    lines = [
        f"# Study report: {sweep_dir.name}", "",
        f"Sweep folder `{sweep_dir}`: {len(jobs)} jobs, "
        + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        + f"; {format_duration(total_seconds)} of training and evaluation in all.",
    ]
    if overrides:
        lines += ["", f"Overrides: `{' '.join(overrides)}`"]
    lines += [
        "", "## Results", "",
        "Losses are mean negative log-likelihoods per token in nats (a character for char models, a "
        "subword for spm models, so they compare only within a tokenizer); bpc is bits per character "
        "of the validation text, which compares across tokenizers. Stateful, stateless, windowed and "
        "bigram are the inference modes of the evaluation; val bpc is the validation split scored in "
        "windows of data.seq_len, each from a zero state. Every figure of this table is of the final "
        "weights (the best checkpoint's are under *Best checkpoint and final weights*).", "",
        "| " + " | ".join(header for _, header, _ in TABLE) + " |",
        "|" + "|".join("---" if key in ("model", "training_mode", "cell", "tokenizer", "status") else "--:" for key, _, _ in TABLE) + "|",
    ]
    lines += ["| " + " | ".join(_cell(job, key, fmt) for key, _, fmt in TABLE) + " |" for job in jobs]
    missing = _missing_lines(jobs, plots)
    lines += ["", "## What is missing", ""] + (missing or ["Nothing: every job completed with every metric."])
    lines += ladder_section(jobs, plots)
    lines += grid_section(jobs, plots, format_duration)
    lines += ["", *findings_markdown([job for job in jobs if job.status == "completed"])]
    lines += _best_section(jobs)
    lines += ["## Context curve", "",
              "Bits per character with the model given only the last w tokens, from its initial state "
              "(w = 1 is the stateless figure), and with the state carried through the whole split "
              "(stateful, at the right); final weights. The points score the windowed figure's targets (all, "
              "or its systematic sample; summary.json's context_curve.settings says which, with standard "
              "errors; docs/evaluation.md).", ""]
    lines += [f"![bits per character against context length]({PLOT_CONTEXT})" if PLOT_CONTEXT in plots
              else f"{MISSING} no completed job has a context curve."]
    lines += ["", "## Inference modes over training", "",
              "Stateful and stateless bits per character of the whole validation split at every validation "
              "(history.csv), against the training tokens.", ""]
    lines += [f"![stateful and stateless bits per character over training]({PLOT_MODES})" if PLOT_MODES in plots
              else f"{MISSING} no job recorded the modes over training."]
    lines += ["", "## Bits per character by inference mode", ""]
    lines += [f"![bits per character by model and inference mode]({PLOT_BPC})" if PLOT_BPC in plots
              else f"{MISSING} no completed job has a bpc to plot."]
    lines += ["", "## Learning curves", ""]
    lines += [f"![training loss and validation bpc against training steps]({PLOT_CURVES})" if PLOT_CURVES in plots
              else f"{MISSING} no job wrote history.csv."]
    lines += ["", *_samples_section(jobs)]
    lines += ["Files: `results.csv` (every number above, full precision), the PNGs beside this report, "
              "and each job's folder (summary.json, history.csv, samples.json, checkpoints)."]
    return "\n".join(lines) + "\n"


def _best_section(jobs: list[JobResult]) -> list[str]:
    lines = ["## Best checkpoint and final weights", "",
             "The checkpoint with the lowest validation loss (best) beside the final weights, both scored in "
             "every mode (bits per character).", ""]
    judged = [job for job in jobs if job.status == "completed"]
    if not any(job.best("step") is not None for job in judged):
        return lines + [f"{MISSING} no summary has a best checkpoint's figures.", ""]
    keys = BEST_KEYS
    lines += ["| model | weights | step | " + " | ".join(k.removesuffix("_bpc").replace("val", "val (chunks)")
                                                          for k in keys) + " |",
              "|---|---|--:|" + "--:|" * len(keys)]
    fmt = lambda value: MISSING if value is None else f"{value:.4f}"  # noqa: E731
    for job in judged:
        if job.best("step") is None:
            lines.append(f"| {_escape(job.model)} | best | {MISSING} |" + f" {MISSING} |" * len(keys))
            continue
        same = (job.values.get("best") or {}).get("same_as_final")
        lines.append(f"| {_escape(job.model)} | final | {job.number('train_steps') or 0:.0f} | "
                     + " | ".join(fmt(job.number(k)) for k in keys) + " |")
        lines.append(f"| {_escape(job.model)} | best{' (= final)' if same else ''} | {job.best('step'):.0f} | "
                     + " | ".join(fmt(job.best(k)) for k in keys) + " |")
    return lines + [""]


# --- the ladder: models of several families side by side ----------------------------------
def ladder_jobs(jobs: list[JobResult]) -> list[JobResult]:
    """The completed jobs, in launch order, when they span more than one model family (the
    summary's "cell": gru, lstm, rnn, mlp, ngram); [] for a sweep of one family."""
    done = [job for job in jobs if job.status == "completed"]
    return done if len({job.values.get("cell") for job in done}) > 1 else []


def _context(job: JobResult) -> str:
    if "context" not in job.values:
        return MISSING
    return "unbounded" if job.values["context"] is None else f"{job.values['context']:,}"


LADDER_COLUMNS = ["model", "family", "context (tokens)", "parameters", "stateful bpc", "stateless bpc",
                  "windowed bpc", "training time"]


def ladder_rows(jobs: list[JobResult]) -> list[list[str]]:
    number = lambda job, key, fmt: MISSING if job.number(key) is None else fmt(job.number(key))  # noqa: E731
    return [[_escape(job.model), _escape(str(job.values.get("cell") or MISSING)), _context(job),
             number(job, "parameters", "{:,}".format), number(job, "stateful_bpc", "{:.4f}".format),
             number(job, "stateless_bpc", "{:.4f}".format), number(job, "windowed_bpc", "{:.4f}".format),
             number(job, "train_seconds", format_duration)] for job in ladder_jobs(jobs)]


def ladder_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    rows = ladder_rows(jobs)
    if not rows:
        return []
    lines = ["", "## The ladder", "",
             "Each model family side by side: validation bits per character with the state carried (stateful) "
             "and reset at every step (stateless: only the last token is seen), and with the last "
             "`evaluation.window` tokens (windowed). Parameters: trainable ones; for an n-gram, the counts it "
             "stores. Training time: the training steps alone; for an n-gram, counting the training split.", "",
             "| " + " | ".join(LADDER_COLUMNS) + " |", "|---|---|" + "--:|" * (len(LADDER_COLUMNS) - 2)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    bigram = next((job.number("bigram_bpc") for job in ladder_jobs(jobs) if job.number("bigram_bpc")), None)
    if bigram is not None:
        lines += ["", f"Baseline: the add-one bigram table of the training split, {bigram:.4f} bits per character."]
    lines += ["", f"![the ladder: stateful and stateless bits per character]({PLOT_LADDER})" if PLOT_LADDER in plots
              else f"{MISSING} no ladder plot."]
    return lines


def plot_ladder(jobs: list[JobResult], path: Path) -> Path | None:
    """Stateful and stateless bpc of every rung, the bigram baseline as a line."""
    rungs = [job for job in ladder_jobs(jobs) if job.number("stateful_bpc") is not None]
    if not rungs:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rungs) + 2), 4.2))
    for offset, key, label in ((-0.2, "stateful_bpc", "stateful"), (0.2, "stateless_bpc", "stateless")):
        _labelled_bars(ax, [i + offset for i in range(len(rungs))], [job.number(key) for job in rungs], 0.4, label)
    bigram = next((job.number("bigram_bpc") for job in rungs if job.number("bigram_bpc")), None)
    if bigram is not None:
        ax.axhline(bigram, color="gray", linestyle="--", linewidth=1, label=f"bigram counts ({bigram:.2f})")
    labels = [f"{job.model}\n{(job.number('parameters') or 0) / 1000:,.0f}k" for job in rungs]
    ax.set_xticks(range(len(rungs)), labels, fontsize=8)
    tallest = max(job.number(key) or 0.0 for job in rungs for key in ("stateful_bpc", "stateless_bpc"))
    ax.set_ylim(0, max(tallest, bigram or 0.0) * 1.25)  # room for the legend above the bars
    return _save_bpc_bars(plt, fig, ax, "The ladder: validation bits per character (parameters or stored counts below)",
                          path)


# --- plots ------------------------------------------------------------------------------
def _figure():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, safe in worker processes
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Write the figure as a PNG (atomically) and close it, also when writing fails."""
    # No timestamp in the PNG metadata: the same results give the same bytes.
    try:
        with atomic_file(path) as f:  # a reader (or a second report builder) never sees half a file
            fig.savefig(f, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
        return path
    finally:
        _figure().close(fig)


def plot_bpc_by_mode(jobs: list[JobResult], path: Path) -> Path | None:
    """Grouped bars: one group per model, one bar per inference mode (val bpc when no job has
    the evaluation's modes)."""
    keys = [f"{mode}_bpc" for mode in FIGURES if any(job.number(f"{mode}_bpc") is not None for job in jobs)]
    labels = [key.removesuffix("_bpc") for key in keys]
    if not keys:
        keys, labels = ["val_bpc"], ["validation (windows, zero state)"]
    shown = [job for job in jobs if any(job.number(key) is not None for key in keys)]
    if not shown:
        return None
    plt = _figure()
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(shown) + 2), 4.2))
    for i, (key, label) in enumerate(zip(keys, labels)):
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(shown))]
        _labelled_bars(ax, xs, [job.number(key) for job in shown], width, label)
    ax.set_xticks(range(len(shown)), [job.model for job in shown], rotation=20, ha="right")
    return _save_bpc_bars(plt, fig, ax, "Validation bits per character by inference mode", path)


def _labelled_bars(ax, xs, values, width, label) -> None:
    """One series of bars (a missing value: an empty bar labelled —), each labelled with its value."""
    bars = ax.bar(xs, [value or 0.0 for value in values], width, label=label)
    for bar, value in zip(bars, values):
        ax.annotate(MISSING if value is None else f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")


def _save_bpc_bars(plt, fig, ax, title: str, path: Path) -> Path:
    ax.set_ylabel("bits per character (lower is better)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_curves(jobs: list[JobResult], path: Path) -> Path | None:
    """Training loss and validation bpc against the training step, every model in one figure."""
    shown = [job for job in jobs if job.history]
    if not shown:
        return None
    plt = _figure()
    fig, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for job in shown:
        label = f"{job.model} ({job.values.get('tokenizer') or '?'})"
        if job.status != "completed":
            label += f", {job.status}"
        for ax, metric in ((train_ax, "train/loss"), (val_ax, "val/bpc")):
            points = job.history.get(metric, [])
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 12 else None, markersize=3, label=label)
    train_ax.set(title="Training loss", xlabel="step", ylabel="nats per token (char or subword)")
    val_ax.set(title="Validation", xlabel="step", ylabel="bits per character")
    for ax in (train_ax, val_ax):
        ax.grid(alpha=0.3)
    train_ax.legend(fontsize=7)
    return _save(fig, path)


def context_curve_series(jobs: list[JobResult]) -> dict[str, dict]:
    """{model: {"windows": [(w, bpc), ...], "stateful": bpc}} from the summaries' context_curve, for
    every completed model with a carried state (count and window models are baselines)."""
    series = {}
    for job in jobs:
        points = curve_points(job.values.get("context_curve")) if job.status == "completed" else []
        if not points or job.values.get("cell") in ("ngram",):
            continue
        series[job.model] = {"windows": [(int(key), value) for key, value in points if key.isdigit()],
                             "stateful": dict(points).get("stateful")}
    return series


def baselines(jobs: list[JobResult]) -> dict[str, float]:
    """Horizontal lines of the context curve: the bigram counts (one per tokenizer) and the best
    n-gram model of the sweep, by stateful bpc."""
    lines = {}
    for job in jobs:
        if job.status == "completed" and job.number("bigram_bpc") is not None:
            lines.setdefault(f"bigram counts ({job.values.get('tokenizer') or '?'})", job.number("bigram_bpc"))
    ngrams = [job for job in jobs if job.status == "completed" and job.values.get("cell") == "ngram"
              and job.number("stateful_bpc") is not None]
    if ngrams:
        best = min(ngrams, key=lambda job: job.number("stateful_bpc"))
        lines[f"best n-gram ({best.model})"] = best.number("stateful_bpc")
    return lines


def plot_context_curve(jobs: list[JobResult], path: Path) -> Path | None:
    """Bits per character against the context length (log axis), one curve per model, its stateful
    figure at the right end; the bigram and the best n-gram as horizontal lines."""
    series = context_curve_series(jobs)
    if not series:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    longest = max(w for s in series.values() for w, _ in s["windows"])
    stateful_x = longest * 4
    for model, s in series.items():
        xs, ys = zip(*s["windows"])
        (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=model)
        if s["stateful"] is not None:
            ax.plot([xs[-1], stateful_x], [ys[-1], s["stateful"]], linestyle=":", color=line.get_color())
            ax.plot([stateful_x], [s["stateful"]], marker="*", markersize=9, color=line.get_color())
    for (label, value), style in zip(baselines(jobs).items(), ["--", "-.", ":", "--"]):
        ax.axhline(value, linestyle=style, color="grey", linewidth=1, label=f"{label} {value:.3f}")
    ax.set_xscale("log", base=2)
    ticks = sorted({w for s in series.values() for w, _ in s["windows"]})
    ax.set_xticks([*ticks, stateful_x], [*(str(t) for t in ticks), "stateful"])
    ax.set(title="Bits per character against the context given (final weights)",
           xlabel="tokens of context (from the initial state); stateful: the state carried",
           ylabel="bits per character (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def modes_over_training_series(jobs: list[JobResult]) -> dict[str, dict]:
    """{model: {"stateful": [(tokens, bpc), ...], "stateless": [...]}} from history.csv, for the models
    trained with steps; tokens = step x the run's tokens per step (summary: train_tokens / train_steps),
    the step itself when unknown."""
    series = {}
    for job in jobs:
        if job.number("train_steps") == 0:  # a counted model (n-gram): one validation, no training to plot
            continue
        per_step = 1.0
        if job.number("train_tokens") and job.number("train_steps"):
            per_step = job.number("train_tokens") / job.number("train_steps")
        curves = {mode: [(step * per_step, value) for step, value in job.history.get(f"val/{mode}_bpc", [])]
                  for mode in ("stateful", "stateless")}
        if any(curves.values()):
            series[job.model] = curves
    return series


def plot_modes_over_training(jobs: list[JobResult], path: Path) -> Path | None:
    """Stateful (solid) and stateless (dashed) validation bpc against training tokens, per model."""
    series = modes_over_training_series(jobs)
    if not series:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for model, curves in series.items():
        color = None
        for mode, style in (("stateful", "-"), ("stateless", "--")):
            if curves[mode]:
                xs, ys = zip(*curves[mode])
                (line,) = ax.plot(xs, ys, linestyle=style, marker="o" if len(xs) < 12 else None, markersize=3,
                                  color=color, label=f"{model} {mode}")
                color = line.get_color()
    ax.set(title="Inference modes over training", xlabel="training tokens", ylabel="bits per character")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


# --- the whole report -------------------------------------------------------------------
def build_report(sweep_dir) -> Report:
    """Read the sweep folder; write results.csv, the plots and report.md into it. Safe to run
    again (and while jobs still run): every file is rewritten whole from what is on disk."""
    sweep_dir = Path(sweep_dir).resolve()
    jobs, overrides = collect(sweep_dir)
    plots = {}
    for name, plot in ((PLOT_BPC, plot_bpc_by_mode), (PLOT_CURVES, plot_curves), (PLOT_LADDER, plot_ladder),
                       (PLOT_CONTEXT, plot_context_curve), (PLOT_MODES, plot_modes_over_training),
                       (PLOT_GRID, lambda jobs, path: plot_training_grid(jobs, path, _figure, _save))):
        if (written := plot(jobs, sweep_dir / name)) is not None:
            plots[name] = written
        elif (sweep_dir / name).exists():
            (sweep_dir / name).unlink()  # a stale plot from an earlier build would contradict the report
    atomic_write(sweep_dir / RESULTS_CSV, results_csv(jobs))
    atomic_write(sweep_dir / REPORT_MD, report_markdown(sweep_dir, jobs, overrides, plots))
    files = {RESULTS_CSV: sweep_dir / RESULTS_CSV, REPORT_MD: sweep_dir / REPORT_MD, **plots}
    return Report(sweep_dir, jobs, overrides, files)


def format_table(report: Report) -> str:
    """The results table as plain text, for the terminal."""
    keys = ["model", "tokenizer", "parameters", "val_bpc", *(f"{m}_bpc" for m in FIGURES), "tokens_per_second",
            "wall_seconds", "status"]
    spec = {key: (header, fmt) for key, header, fmt in TABLE}
    rows = [[spec[key][0] for key in keys]]
    rows += [[html.unescape(_cell(job, key, spec[key][1])) for key in keys] for job in report.jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(keys))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows)


# --- W&B --------------------------------------------------------------------------------
def wandb_jobs(report: Report) -> list[JobResult]:
    return [job for job in report.jobs if str(job.logger.get("_target_") or "").endswith("WandbLogger")]


def log_to_wandb(report: Report, mode: str, project: str | None = None, group: str | None = None):
    """A "summary" run in the sweep's W&B group with the results table, the plots and each
    model's numbers. Its id is fixed per sweep folder, so building the report again updates
    the same run (online) instead of adding another. Returns the finished run."""
    import wandb

    from gru_experiments.loggers import sweep_group

    logged = wandb_jobs(report)
    first = logged[0].logger if logged else {}
    project = project or first.get("project") or "gru-experiments"
    group = group or sweep_group(first.get("group"), report.sweep_dir)
    run_id = "summary-" + hashlib.sha1(f"{project}/{group}/{report.sweep_dir}".encode()).hexdigest()[:12]
    run = wandb.init(project=project, group=group, name="summary", job_type="report", id=run_id,
                     resume="allow", dir=str(report.sweep_dir), mode=mode,
                     config={"sweep_dir": str(report.sweep_dir), "overrides": report.overrides})
    try:
        columns = [key for key in COLUMNS if key not in ("error", "run_dir")]
        data = [[job.status if key == "status" else job.job if key == "job" else
                 (job.number(key) if key not in ("model", "training_mode", "cell", "tokenizer") else job.values.get(key))
                 for key in columns] for job in report.jobs]
        payload = {"results": wandb.Table(columns=columns, data=data)}
        payload.update({f"plots/{Path(name).stem}": wandb.Image(str(path)) for name, path in report.files.items()
                        if name.endswith(".png")})
        run.log(payload)
        run.summary.update({f"{job.model}/{key}": job.number(key) for job in report.completed
                            for key in ("val_bpc", *(f"{mode}_bpc" for mode in FIGURES)) if job.number(key) is not None})
        run.summary.update({"jobs_completed": len(report.completed), "jobs_not_completed": len(report.problems)})
    finally:
        run.finish()
    return run
