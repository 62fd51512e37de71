"""The learning-rate sweep (report.md's *Learning rate and recipe*, `lr_sweep.png`): each model and recipe at
every learning rate it was trained with (`python sweep.py models=lr_alpha 'model.lr=1e-3,2e-3'`), and each
family at each size at its best, chosen on the validation split the same way for every family.
"""

from pathlib import Path

from gru_experiments.report.common import MISSING, figure_cell, finish, image, save, subplots, table
from gru_experiments.report.section import Section
from gru_experiments.report.sweep_folder import JobResult

PLOT_LR = "lr_sweep.png"
SCORE = "stateful_bpc"  # what a learning rate is chosen by: the study's headline figure


def arms(jobs: list[JobResult]) -> dict[tuple, dict[float, JobResult]]:
    """{(model, training mode, recipe): {lr: job}} of the started jobs; {} unless an arm has two lrs."""
    found: dict[tuple, dict[float, JobResult]] = {}
    for job in jobs:
        lr = job.values.get("lr")
        if job.status in ("completed", "failed", "incomplete") and isinstance(lr, (int, float)) and job.recipe:
            found.setdefault((job.name, job.training_mode, job.recipe), {})[float(lr)] = job
    return found if any(len(by_lr) > 1 for by_lr in found.values()) else {}


def scored(job: JobResult) -> bool:
    return job.status == "completed" and job.number(SCORE) is not None


def at_best(jobs: list[JobResult]) -> list[JobResult]:
    """The completed jobs, each family at each size and training mode reduced to its best (the first of a tie), in
    launch order."""
    return [job for job in jobs if scored(job) and job is min(rivals(job, jobs), key=lambda other: other.number(SCORE))]


def rivals(job: JobResult, jobs: list[JobResult]) -> list[JobResult]:
    """The jobs `at_best` chooses it among: the scored ones of its family, tokenizer, size and training mode."""
    return [other for other in jobs if scored(other) and _size(other) == _size(job)]


def _size(job: JobResult) -> tuple:
    return job.values.get("family"), job.values.get("tokenizer"), job.number("parameters"), job.training_mode


def _cell(job: JobResult, best: bool) -> str:
    if job.status == "failed":
        return "diverged" if "diverged" in str(job.values.get("error") or "") else "failed"
    if job.status == "incomplete":
        return "incomplete"
    text = figure_cell(job, SCORE)
    return f"**{text}**" if best else text


def lr_section(jobs: list[JobResult], plots: dict[str, Path]) -> list[str]:
    found = arms(jobs)
    if not found:
        return []
    rates = sorted({lr for by_lr in found.values() for lr in by_lr})
    lines = ["", "## Learning rate and recipe", "",
             "Stateful bits per character of the final weights ± one standard error, for each model and optimiser "
             "recipe (conf/optim/) at each learning rate, every run the full recipe's length; the best of each row "
             "in bold. Chosen on the validation split (the split every figure here is scored on), the same way for "
             "every family. Training time: the row's mean.", ""]
    rows = []
    for (name, mode, recipe), by_lr in found.items():
        done = {lr: job for lr, job in by_lr.items() if scored(job)}
        best = min(done, key=lambda lr: done[lr].number(SCORE)) if done else None
        seconds = [job.number("train_seconds") for job in done.values() if job.number("train_seconds")]
        rows.append([name, mode, recipe, *(_cell(by_lr[lr], lr == best) if lr in by_lr else "" for lr in rates),
                     MISSING if best is None else f"{best:g}",
                     f"{sum(seconds) / len(seconds) / 60:.1f} min" if seconds else MISSING])
    lines += table(["model", "training", "recipe", *(f"lr {lr:g}" for lr in rates), "best lr", "training time"],
                   rows, "lllr")
    chosen = [job for job in at_best(jobs) if len(rivals(job, jobs)) > 1 and job.number("lr") is not None]
    if chosen:
        lines += ["", "Each family at its best (the lowest stateful figure of its size): "
                  + "; ".join(f"{job.name}, recipe {job.recipe}, lr {job.number('lr'):g}: {job.number(SCORE):.4f}"
                              f" (best of {len(rivals(job, jobs))})" for job in chosen) + "."]
    lines += ["", image("stateful bits per character against the learning rate", PLOT_LR, plots,
                        "no learning-rate plot.")]
    return lines


def plot_lr(jobs: list[JobResult], path: Path) -> Path | None:
    """Stateful bits per character against the learning rate (log scale), a line per model and recipe."""
    lines = {arm: sorted((lr, job.number(SCORE), job.number(f"{SCORE}_se") or 0.0) for lr, job in by_lr.items()
                         if scored(job)) for arm, by_lr in arms(jobs).items() if any(map(scored, by_lr.values()))}
    if not lines:
        return None
    fig, ax = subplots(figsize=(6.4, 4.2))
    for (name, mode, recipe), points in lines.items():
        lrs, values, errors = zip(*points)
        label = f"{name}{' (streams)' if mode == 'streams' else ''}, {recipe}"
        ax.errorbar(lrs, values, yerr=errors, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    finish(ax, 8, title="Learning rate and recipe: the final weights on the validation split",
           xlabel="learning rate (model.lr, the schedule's peak)",
           ylabel="stateful bits per character (lower is better)")
    return save(fig, path)


SECTION = Section("learning rate and recipe", lr_section, plots={PLOT_LR: plot_lr})
