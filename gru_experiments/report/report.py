"""The study's report over a sweep folder: results.csv, report.md and PNG plots, and a W&B
summary run that carries the same table and plots.

A sweep folder holds one folder per job (Hydra's multirun layout); everything is read from
what the jobs wrote there:

    <job>/.hydra/config.yaml   what the job was asked to train (model, architecture, tokenizer, logger)
    <job>/summary.json         its results, or status "failed" and the error
    <job>/history.csv          its learning curves (gru_experiments/runs/history.py)
    <job>/samples.json         stateful and stateless samples for the study's prompts
    multirun.yaml              the sweep's overrides, hence the models it was meant to train

Nothing is recomputed, so building the report is cheap, can run while jobs are still going,
and gives the same files every time it runs over the same folder.
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from gru_experiments.files import atomic_write
from gru_experiments.report.context_classes import CLASS_COLUMNS, PLOT_CLASSES, class_section, plot_classes
from gru_experiments.report.findings import findings_markdown
from gru_experiments.report.lr_sweep import PLOT_LR, lr_section, plot_lr
from gru_experiments.report.plots import (
    PLOT_BPC,
    PLOT_CONTEXT,
    PLOT_CURVES,
    PLOT_LADDER,
    PLOT_MODES,
    _figure,
    _save,
    plot_bpc_by_mode,
    plot_context_curve,
    plot_curves,
    plot_ladder,
    plot_modes_over_training,
)
from gru_experiments.report.recall_horizon import cost_section, horizon_section
from gru_experiments.report.recall_report import PLOT_RECALL, plot_recall, recall_section
from gru_experiments.report.sweep_folder import MISSING, JobResult, Report, collect, ladder_jobs
from gru_experiments.report.text_report import PLOT_TEXT, TEXT_COLUMNS, plot_text, text_section
from gru_experiments.report.training_grid import PLOT_GRID, grid_section, plot_training_grid
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.study.evaluation import FIGURES
from gru_experiments.study.inference import MODES

RESULTS_CSV, REPORT_MD = "results.csv", "report.md"

# (column, header in report.md, format); results.csv has every column of COLUMNS.
TABLE = [
    ("model", "model", str), ("training_mode", "training", str), ("family", "family", str),
    ("tokenizer", "tokenizer", str),
    ("parameters", "parameters", "{:,}".format),
    ("optim", "recipe", str), ("lr", "lr", "{:g}".format),
    ("train_loss", "train loss", "{:.4f}".format), ("val_loss", "val loss", "{:.4f}".format),
    ("val_bpc", "val bpc", "{:.4f}".format),
    *((f"{mode}_bpc", f"{mode} bpc", "{:.4f}".format) for mode in FIGURES),
    ("tokens_per_second", "tokens/s", "{:,.0f}".format),
    ("wall_seconds", "wall time", lambda s: format_duration(s)),
    ("status", "status", str),
]
BEST_KEYS = ["val_bpc", *(f"{mode}_bpc" for mode in MODES)]  # summary["best"]: the best checkpoint's figures
DERIVED = {**TEXT_COLUMNS, **CLASS_COLUMNS}  # results.csv's columns read from a summary's records, not its keys
COLUMNS = ["job", *(key for key, _, _ in TABLE), *(f"{mode}_nll" for mode in FIGURES), "state_gain_bpc",
           "state_gain_se", "best_step",
           *(f"best_{key}" for key in BEST_KEYS), *DERIVED, "error", "run_dir"]


# --- writing ----------------------------------------------------------------------------
def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _cell(job: JobResult, key: str, fmt) -> str:
    value = job.values.get(key)
    if key in ("model", "training_mode", "family", "tokenizer", "optim", "status"):
        value = {"status": job.status, "model": job.model, "optim": job.recipe}.get(key, value)
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
            elif key in DERIVED:
                value = DERIVED[key](job)
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
        "|" + "|".join("---" if key in ("model", "training_mode", "family", "tokenizer", "optim", "status") else "--:"
                       for key, _, _ in TABLE) + "|",
    ]
    lines += ["| " + " | ".join(_cell(job, key, fmt) for key, _, fmt in TABLE) + " |" for job in jobs]
    missing = _missing_lines(jobs, plots)
    lines += ["", "## What is missing", ""] + (missing or ["Nothing: every job completed with every metric."])
    lines += ladder_section(jobs, plots)
    lines += lr_section(jobs, plots)
    lines += grid_section(jobs, plots, format_duration)
    lines += ["", *findings_markdown([job for job in jobs if job.status == "completed"])]
    lines += _best_section(jobs) + _figure_sections(jobs, plots)
    lines += ["", *recall_section(jobs, plots), *horizon_section(jobs), *cost_section(jobs),
              *text_section(jobs, plots), *_samples_section(jobs), *explore_section(jobs)]
    lines += ["Files: `results.csv` (every number above, full precision), the PNGs beside this report, "
              "and each job's folder (summary.json, history.csv, samples.json, checkpoints)."]
    return "\n".join(lines) + "\n"


def explore_section(jobs: list[JobResult]) -> list[str]:
    """A link to each job's page (explore.html, written by sample.py run=JOB explore=true) that exists."""
    pages = [(job, RunDir(job.run_dir).explore_file) for job in jobs if job.run_dir is not None]
    links = [f"- [{job.model}]({job.job}/{page.name})" for job, page in pages if page.exists()]
    if not links:
        return []
    return ["## The runs' pages", "", "Each character shaded by its bits in every mode, and the hidden units "
            "(docs/explore.md):", "", *links, ""]


def _figure_sections(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    """The context curve (all targets, then by class), the modes over training, bpc by mode, learning curves."""
    lines = ["## Context curve", "",
             "Bits per character with the model given only the last w tokens, from its initial state "
             "(w = 1 is the stateless figure), and with the state carried through the whole split "
             "(stateful, at the right); final weights. The points score the windowed figure's targets (all, "
             "or its systematic sample; summary.json's context_curve.settings says which, with standard "
             "errors; docs/evaluation.md).", ""]
    lines += [f"![bits per character against context length]({PLOT_CONTEXT})" if PLOT_CONTEXT in plots
              else f"{MISSING} no completed job has a context curve."]
    lines += ["", *class_section(jobs, plots)]
    lines += ["## Inference modes over training", "",
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
    return lines


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


def _context(job: JobResult) -> str:
    if "context" not in job.values:
        return MISSING
    return "unbounded" if job.values["context"] is None else f"{job.values['context']:,}"


LADDER_COLUMNS = ["model", "family", "context (tokens)", "parameters", "stateful bpc", "stateless bpc",
                  "windowed bpc", "training time"]


def ladder_rows(jobs: list[JobResult]) -> list[list[str]]:
    number = lambda job, key, fmt: MISSING if job.number(key) is None else fmt(job.number(key))  # noqa: E731
    return [[_escape(job.model), _escape(str(job.values.get("family") or MISSING)), _context(job),
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


# --- the whole report -------------------------------------------------------------------
def build_report(sweep_dir) -> Report:
    """Read the sweep folder; write results.csv, the plots and report.md into it. Safe to run
    again (and while jobs still run): every file is rewritten whole from what is on disk."""
    sweep_dir = Path(sweep_dir).resolve()
    jobs, overrides = collect(sweep_dir)
    plots = {}
    for name, plot in ((PLOT_BPC, plot_bpc_by_mode), (PLOT_CURVES, plot_curves), (PLOT_LADDER, plot_ladder),
                       (PLOT_CONTEXT, plot_context_curve), (PLOT_MODES, plot_modes_over_training),
                       (PLOT_GRID, lambda jobs, path: plot_training_grid(jobs, path, _figure, _save)),
                       (PLOT_CLASSES, plot_classes), (PLOT_RECALL, plot_recall), (PLOT_TEXT, plot_text),
                       (PLOT_LR, plot_lr)):
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
    keys = ["model", "tokenizer", "parameters", "optim", "lr", "val_bpc", *(f"{m}_bpc" for m in FIGURES),
            "tokens_per_second", "wall_seconds", "status"]
    spec = {key: (header, fmt) for key, header, fmt in TABLE}
    rows = [[spec[key][0] for key in keys]]
    rows += [[html.unescape(_cell(job, key, spec[key][1])) for key in keys] for job in report.jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(keys))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows)
