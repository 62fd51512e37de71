"""The study's report over a sweep folder: results.csv, report.md and PNG plots, read from what the jobs
wrote there (docs/outputs.md#sweep-folders), nothing recomputed: cheap, possible while jobs still run; and
its W&B summary run. `SECTIONS` is the one list of its parts (section.py); `register_section` adds one.
"""

import csv
import hashlib
import html
import io
from pathlib import Path

from gru_experiments.files import atomic_write
from gru_experiments.report import (
    cache,
    context_classes,
    dynamic,
    lr_sweep,
    overfitting,
    past_window,
    recall,
    recall_horizon,
    scale,
    text,
)
from gru_experiments.report import plots as figures
from gru_experiments.report import training_grid as grid
from gru_experiments.report.common import MISSING, cell, escape, table
from gru_experiments.report.findings import STUDY
from gru_experiments.report.section import Section
from gru_experiments.report.seed_groups import group_settings, spread
from gru_experiments.report.sweep_folder import JobResult, Report, collect, name_variants
from gru_experiments.runs.loggers import names_wandb, sweep_group
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.study.cost import duration
from gru_experiments.study.evaluation import FIGURES
from gru_experiments.study.modes import MODES, STATEFUL, STATELESS

RESULTS_CSV, REPORT_MD = "results.csv", "report.md"

# (column, header in report.md, format); results.csv has every column of them (columns()).
TABLE = [
    ("model", "model", str), ("training_mode", "training", str), ("family", "family", str),
    ("tokenizer", "tokenizer", str),
    ("parameters", "parameters", "{:,}".format),
    ("optim", "recipe", str), ("lr", "lr", "{:g}".format),
    ("train_loss", "train loss", "{:.4f}".format), ("val_loss", "val loss", "{:.4f}".format),
    ("val_bpc", "val bpc", "{:.4f}".format),
    *((f"{mode}_bpc", f"{mode} bpc", "{:.4f}".format) for mode in FIGURES),
    ("tokens_per_second", "tokens/s", "{:,.0f}".format),
    ("wall_seconds", "wall time", duration),
    ("status", "status", str), ("n", "n", str),  # n: the setting's trainings (seed_groups.py)
]
BEST_KEYS = ["val_bpc", *(f"{mode}_bpc" for mode in MODES)]  # summary["best"]: the best checkpoint's figures
# A setting's figures over its trainings: the between-training standard deviation (results.csv's KEY_sd) of these,
# beside each one's within-run standard error (KEY_se); report.md writes them "mean ± sd".
SPREAD_KEYS = ["val_loss", "val_bpc", *(f"{mode}_bpc" for mode in FIGURES), "state_gain_bpc"]


def derived() -> dict:
    """results.csv's columns that the sections read from a summary's records, not its keys: {column: value(job)}."""
    return {key: value for section in sorted(SECTIONS, key=lambda section: section.column_rank)
            for key, value in section.columns.items()}


def columns() -> list[str]:
    """results.csv's columns: the summary's keys of every job, then the sections' (`derived`)."""
    return ["job", "row", "seed", *(key for key, _, _ in TABLE), *(f"{mode}_nll" for mode in FIGURES), "state_gain_bpc",
            "state_gain_se", *(f"{key}_sd" for key in SPREAD_KEYS), *(f"{mode}_bpc_se" for mode in FIGURES),
            "best_step", *(f"best_{key}" for key in BEST_KEYS), *derived(), "error", "run_dir"]


# --- writing ----------------------------------------------------------------------------
def _cell(job: JobResult, key: str, fmt) -> str:
    if fmt is str:  # a column of words
        words = {"status": job.status, "model": job.model, "optim": job.recipe, "n": trainings(job)}
        value = words.get(key, job.values.get(key))
        return escape(str(value)) if value else MISSING
    sd = spread(job, key) if key in SPREAD_KEYS else None
    return cell(job.number(key), lambda value: fmt(value) + ("" if sd is None else f" ± {fmt(sd)}"))


def trainings(job: JobResult) -> int | None:
    """Column n: the completed trainings a row stands for; none for a job not completed (it is no setting)."""
    return job.n if job.status == "completed" else None


def results_rows(settings: list[JobResult], keys: list[str]) -> list[list]:
    """results.csv's rows, its `keys` columns (the W&B summary's table reads them too): a row per setting (its
    means over its trainings, "row" setting), then, for a setting of several trainings, a row per run ("run")."""
    read = {"job": lambda job: job.job, "status": lambda job: job.status, "run_dir": lambda job: job.run_dir or "",
            "model": lambda job: job.name, "n": trainings, "seed": lambda job: job.values.get("seed"),
            **{f"{key}_sd": (lambda job, key=key: spread(job, key)) for key in SPREAD_KEYS},
            **{f"best_{key}": (lambda job, key=key: job.best(key)) for key in ["step", *BEST_KEYS]}, **derived()}
    rows = [(kind, job) for setting in settings
            for kind, job in [("setting", setting), *(("run", run) for run in setting.runs if setting.n > 1)]]
    return [[kind if key == "row" else read[key](job) if key in read else job.values.get(key) for key in keys]
            for kind, job in rows]


def results_csv(settings: list[JobResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(keys := columns())
    for values in results_rows(settings, keys):
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in values])
    return out.getvalue()


def _missing_lines(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    lines = []
    for job in jobs:
        if job.status == "failed":
            error = str(job.values.get("error") or "no error recorded").strip().splitlines()[0]
            lines.append(f"- **{job.model}** failed (`{job.job}`): {escape(error)}")
        elif job.status == "incomplete" and job.unreadable is not None:
            lines.append(f"- **{job.model}** (`{job.job}`): its summary `{job.unreadable}` is unreadable (not a JSON "
                         "object: cut off while it was written, or edited); its figures are left out")
        elif job.status == "incomplete":
            lines.append(f"- **{job.model}** has no summary yet (`{job.job}`): still running, or stopped "
                         f"before it finished (killed, out of memory)")
        elif job.status == "missing":
            lines.append(f"- **{job.model}** was planned but never started"
                         + (f" (`{' '.join(job.overrides)}`), or its folder `{job.job}` was removed" if job.job else
                            f" (`{' '.join(job.overrides)}`)" if job.overrides else ""))
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
    if completed and figures.PLOT_BPC not in plots:
        lines.append("- no bits-per-character plot: no completed job has a bpc")
    return lines


def _samples_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    lines = ["## Samples: stateful vs stateless", "",
             "The same weights sampled with the hidden state carried across steps (stateful) and reset "
             "to zero at every step (stateless).", ""]
    with_samples = [job for job in jobs if job.samples is not None]
    if not with_samples:
        return lines + [f"{MISSING} no job wrote samples.json.", ""]
    for job in with_samples:
        samples = job.samples
        prompts, stateful, stateless = (list(samples.get(key) or []) for key in ("prompts", STATEFUL, STATELESS))
        pick = lambda texts, i: escape(str(texts[i])) if i < len(texts) and texts[i] is not None else MISSING  # noqa: E731
        rows = [[f"`{escape(str(prompt)).strip()}`", pick(stateful, i), pick(stateless, i)]
                for i, prompt in enumerate(prompts)]
        lines += [f"### {job.model}", "", *table(["prompt", STATEFUL, STATELESS], rows, "l")]
        if samples.get("settings"):
            settings = ", ".join(f"{k}={v}" for k, v in samples["settings"].items())
            lines += ["", f"Settings: {escape(settings)}"]
        lines.append("")
    without = [job.model for job in jobs if job.status == "completed" and job.samples is None]
    if without:
        lines += [f"No samples for: {', '.join(without)}.", ""]
    return lines


def report_markdown(sweep_dir: Path, runs: list[JobResult], jobs: list[JobResult], overrides: list[str],
                    plots: dict[str, Path]) -> str:
    """report.md: `runs` every job of the sweep, `jobs` its settings (group_settings), which the sections read."""
    counts = {status: sum(job.status == status for job in runs)
              for status in ("completed", "failed", "incomplete", "missing")}
    total_seconds = sum(job.number("wall_seconds") or 0.0 for job in runs)
    repeated = [job for job in jobs if job.n > 1]
    lines = [
        f"# Study report: {sweep_dir.name}", "",
        f"Sweep folder `{sweep_dir}`: {len(runs)} jobs, "
        + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        + f"; {duration(total_seconds)} of training and evaluation in all.",
    ]
    if repeated:
        lines += ["", f"{len(repeated)} of its {len(jobs)} settings were trained more than once (runs that differ in "
                  "their seed alone are one setting, column n): each such setting's figures, in every table below, "
                  "are the means over its trainings, and a bits-per-character figure of the results table is "
                  "written \"mean ± the standard deviation between its trainings\" (results.csv: KEY_sd, beside "
                  "the within-run standard error KEY_se, and a row per run). A setting with n = 1 is one training."]
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
        *table([header for _, header, _ in TABLE], [[_cell(job, key, fmt) for key, _, fmt in TABLE] for job in jobs],
               "".join("l" if fmt is str else "r" for _, _, fmt in TABLE)),
    ]
    missing = _missing_lines(jobs, plots)
    lines += ["", "## What is missing", ""] + (missing or ["Nothing: every job completed with every metric."])
    for section in SECTIONS:
        lines += section.markdown(jobs, plots)
    lines += ["Files: `results.csv` (every number above, full precision), the PNGs beside this report, "
              "and each job's folder (summary.json, history.csv, samples.json, checkpoints)."]
    return "\n".join(lines) + "\n"


def explore_section(jobs: list[JobResult], plots: dict | None = None) -> list[str]:
    """A link to each job's page (explore.html, written by sample.py run=JOB explore=true) that exists."""
    pages = [(job, RunDir(job.run_dir).explore_file) for job in jobs if job.run_dir is not None]
    links = [f"- [{job.model}]({job.job}/{page.name})" for job, page in pages if page.exists()]
    if not links:
        return []
    return ["## The runs' pages", "", "Each character shaded by its bits in every mode, and the hidden units "
            "(docs/explore.md):", "", *links, ""]


def _best_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    lines = ["## Best checkpoint and final weights", "",
             "The checkpoint with the lowest validation loss (best) beside the final weights, both scored in "
             "every mode (bits per character).", ""]
    judged = [job for job in jobs if job.status == "completed"]
    if not any(job.best("step") is not None for job in judged):
        return lines + [f"{MISSING} no summary has a best checkpoint's figures.", ""]
    fmt = "{:.4f}".format
    rows = []
    for job in judged:
        if job.best("step") is None:
            rows.append([escape(job.model), "best", MISSING, *([MISSING] * len(BEST_KEYS))])
            continue
        same = (job.values.get("best") or {}).get("same_as_final")
        rows += [[escape(job.model), "final", f"{job.number('train_steps') or 0:.0f}",
                  *(cell(job.number(k), fmt) for k in BEST_KEYS)],
                 [escape(job.model), f"best{' (= final)' if same else ''}", f"{job.best('step'):.0f}",
                  *(cell(job.best(k), fmt) for k in BEST_KEYS)]]
    header = ["model", "weights", "step", *(k.removesuffix("_bpc").replace("val", "val (chunks)") for k in BEST_KEYS)]
    return lines + table(header, rows, "llr") + [""]


def _findings_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    """report.md's *Findings* sections: each section's group (the study's first), numbered on."""
    jobs = [job for job in jobs if job.status == "completed"]
    if not jobs:
        return ["", f"## {STUDY.heading}", "", STUDY.intro, "", "No completed job: nothing to judge.", ""]
    lines = []
    for group in (section.findings for section in SECTIONS if section.findings is not None):
        first = finding_number(next(iter(group.rules))) if group.rules else 1  # a group of no claim numbers none
        lines += ["", *group.markdown(jobs, first)]
    return lines + [""]


def finding_number(claim: str) -> int:
    """The number report.md gives the finding of that claim: the registered sections' findings, numbered on (so a
    finding added before it moves it, and whatever reads a finding finds it by its claim)."""
    claims = [claim for section in SECTIONS if section.findings is not None for claim in section.findings.rules]
    return claims.index(claim) + 1


def _one_training(jobs: list[JobResult], seed) -> list[JobResult]:
    """The settings as that seed's training alone would have given them (a setting without it, as it is)."""
    return [next((run for run in job.runs if run.values.get("seed") == seed), job) for job in jobs]


def _verdicts_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    """Each finding's verdict from each seed's trainings alone beside its verdict over all of them."""
    jobs = [job for job in jobs if job.status == "completed"]
    seeds = sorted({run.values.get("seed") for job in jobs if job.n > 1 for run in job.runs}, key=str)
    if not seeds:
        return []
    groups = [section.findings for section in SECTIONS if section.findings is not None]
    over = [finding for group in groups for finding in group.judge(jobs)]
    alone = {seed: [f.verdict for group in groups for f in group.judge(_one_training(jobs, seed))] for seed in seeds}
    rows = [[str(i), escape(finding.claim), *(alone[seed][i - 1] for seed in seeds), f"**{finding.verdict}**",
             "yes" if any(alone[seed][i - 1] != finding.verdict for seed in seeds) else ""]
            for i, finding in enumerate(over, 1) if finding.verdict != "cannot be judged"]
    changed = sum(row[-1] == "yes" for row in rows)
    return ["## Verdicts over trainings", "",
            f"Each finding judged by one training of every setting (each seed's alone) beside its verdict over all of "
            f"them (the *Findings* above); {changed} of the {len(rows)} findings this sweep can judge change with "
            "the training they rest on. Findings it cannot judge are left out.", "",
            *table(["#", "finding", *(f"seed {seed} alone" for seed in seeds), "over seeds", "changes"], rows, "rl"),
            ""]


# --- the sections, in report.md's order -------------------------------------------------------------------
SECTIONS: list[Section] = [
    figures.LADDER, lr_sweep.SECTION, grid.SECTION,
    Section("findings", _findings_section, findings=STUDY),
    Section("verdicts over trainings", _verdicts_section),
    Section("best checkpoint", _best_section),
    figures.CONTEXT, context_classes.SECTION, figures.MODES_OVER_TRAINING, figures.BPC, figures.CURVES,
    recall.SECTION, recall_horizon.HORIZON, recall.COST, text.SECTION,
    scale.SECTION, overfitting.SECTION, recall_horizon.LSTM, cache.SECTION, past_window.SECTION,
    dynamic.SECTION,
    Section("samples", _samples_section),
    Section("runs' pages", explore_section),
]


def register_section(section: Section, before: str | None = None) -> Section:
    """Add a section (its columns, plots and findings with it) at the end or before the one named `before`."""
    names = [known.name for known in SECTIONS]
    if section.name in names or set(section.columns) & set(columns()):  # unregister_section goes by the name
        raise ValueError(f"report section {section.name!r}: its name, or one of its columns, is taken")
    SECTIONS.insert(names.index(before) if before is not None else len(SECTIONS), section)
    return section


def unregister_section(name: str) -> None:
    SECTIONS[:] = [section for section in SECTIONS if section.name != name]


# --- the whole report -------------------------------------------------------------------
def build_report(sweep_dir) -> Report:
    """Read the sweep folder; write results.csv, the plots and report.md into it, each whole (safe to rerun)."""
    sweep_dir = Path(sweep_dir).resolve()
    runs, overrides = collect(sweep_dir)
    jobs = group_settings(runs)
    name_variants(jobs)
    plots = {}
    for name, plot in ((name, plot) for section in SECTIONS for name, plot in section.plots.items()):
        if (written := plot(jobs, sweep_dir / name)) is not None:
            plots[name] = written
        elif (sweep_dir / name).exists():
            (sweep_dir / name).unlink()  # a stale plot from an earlier build would contradict the report
    atomic_write(sweep_dir / RESULTS_CSV, results_csv(jobs))
    atomic_write(sweep_dir / REPORT_MD, report_markdown(sweep_dir, runs, jobs, overrides, plots))
    files = {RESULTS_CSV: sweep_dir / RESULTS_CSV, REPORT_MD: sweep_dir / REPORT_MD, **plots}
    return Report(sweep_dir, runs, overrides, files, jobs)


def format_table(report: Report) -> str:
    """The results table as plain text, for the terminal."""
    shown = [column for column in TABLE if column[0] not in ("training_mode", "family", "train_loss", "val_loss")]
    rows = [[header for _, header, _ in shown]]
    rows += [[html.unescape(_cell(job, key, fmt)) for key, _, fmt in shown] for job in report.settings]
    widths = [max(len(row[i]) for row in rows) for i in range(len(shown))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows)


def wandb_jobs(report: Report) -> list[JobResult]:
    return [job for job in report.jobs if names_wandb(job.logger.get("_target_"))]


def log_to_wandb(report: Report, mode: str, project: str | None = None, group: str | None = None):
    """A "summary" run in the sweep's W&B group: the results table, the plots, each model's numbers. Its
    id is fixed per sweep folder, so building the report again updates it. Returns the finished run."""
    import wandb

    logged, completed = wandb_jobs(report), [job for job in report.jobs if job.status == "completed"]
    first = logged[0].logger if logged else {}
    project = project or first.get("project") or "gru-experiments"
    group = group or sweep_group(first.get("group"), report.sweep_dir)
    run_id = "summary-" + hashlib.sha1(f"{project}/{group}/{report.sweep_dir}".encode()).hexdigest()[:12]
    run = wandb.init(project=project, group=group, name="summary", job_type="report", id=run_id,
                     resume="allow", dir=str(report.sweep_dir), mode=mode,
                     config={"sweep_dir": str(report.sweep_dir), "overrides": report.overrides})
    try:
        keys = [key for key in columns() if key not in ("error", "run_dir")]
        payload = {"results": wandb.Table(columns=keys, data=results_rows(report.settings, keys))}
        payload.update({f"plots/{Path(name).stem}": wandb.Image(str(path)) for name, path in report.files.items()
                        if name.endswith(".png")})
        run.log(payload)
        run.summary.update({f"{job.model}/{key}": job.number(key) for job in report.settings
                            if job.status == "completed"
                            for key in ("val_bpc", *(f"{mode}_bpc" for mode in FIGURES))
                            if job.number(key) is not None})
        run.summary.update({"jobs_completed": len(completed), "jobs_not_completed": len(report.problems)})
    finally:
        run.finish()
    return run
