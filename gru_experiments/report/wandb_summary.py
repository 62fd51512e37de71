"""The sweep's W&B "summary" run: the results table, the plots and each model's numbers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gru_experiments.report.report import columns, results_rows
from gru_experiments.report.sweep_folder import JobResult, Report
from gru_experiments.study.evaluation import FIGURES


def wandb_jobs(report: Report) -> list[JobResult]:
    return [job for job in report.jobs if str(job.logger.get("_target_") or "").endswith("WandbLogger")]


def log_to_wandb(report: Report, mode: str, project: str | None = None, group: str | None = None):
    """A "summary" run in the sweep's W&B group: the results table, the plots, each model's numbers. Its
    id is fixed per sweep folder, so building the report again updates it. Returns the finished run."""
    import wandb

    from gru_experiments.runs.loggers import sweep_group

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
        payload = {"results": wandb.Table(columns=keys, data=results_rows(report.jobs, keys))}
        payload.update({f"plots/{Path(name).stem}": wandb.Image(str(path)) for name, path in report.files.items()
                        if name.endswith(".png")})
        run.log(payload)
        run.summary.update({f"{job.model}/{key}": job.number(key) for job in completed
                            for key in ("val_bpc", *(f"{mode}_bpc" for mode in FIGURES))
                            if job.number(key) is not None})
        run.summary.update({"jobs_completed": len(completed), "jobs_not_completed": len(report.problems)})
    finally:
        run.finish()
    return run
