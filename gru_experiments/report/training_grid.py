"""The training x inference grid (report.md's *Training mode against inference mode*, `training_grid.png`):
every model trained both ways (`python sweep.py models=grid training=windows,streams`), each scored in
every inference mode, with stateful - windowed: what carrying the state buys beyond the window.
"""

from pathlib import Path

from gru_experiments.report.common import cell, finish, grouped_bars, image, plus_minus, save, subplots, table
from gru_experiments.report.section import Section
from gru_experiments.report.sweep_folder import trainings
from gru_experiments.study.cost import duration
from gru_experiments.study.modes import MODES_BY_CONTEXT

ORDER = {"windows": 0, "streams": 1}  # the grid's order of the training modes; any other comes last
PLOT_GRID = "training_grid.png"


def grid_models(jobs) -> dict[str, dict]:
    """{model name: {training: job}} of the completed models trained in more than one mode; training: the mode, with
    its window ("windows (512)") where the model was trained in one mode at two windows."""
    grid = {}
    for name, runs in trainings([job for job in jobs if job.status == "completed"]).items():
        modes = [mode for mode, _ in runs]
        if len(set(modes)) < 2:
            continue
        windowed = len(set(modes)) < len(modes)  # a mode twice: tell its runs apart by their windows
        in_order = sorted(runs.values(), key=lambda job: (ORDER.get(job.training_mode, 2), job.training_window or 0))
        grid[name] = {job.training if windowed else job.training_mode: job for job in in_order}
    return grid


def _settings(job) -> str:
    window = (job.values.get("mode_evaluation") or {}).get("window")
    longest = ((job.values.get("context_curve") or {}).get("settings") or {}).get("longest")
    return f"windowed: the last {window or '?'} tokens; the context curve's longest point: {longest or '?'} tokens"


def grid_section(jobs, plots: dict[str, Path]) -> list[str]:
    grid = grid_models(jobs)
    if not grid:
        return []
    lines = ["## Training mode against inference mode", "",
             "Each model trained on random windows from a zero state (`training=windows`) and with the state "
             "carried across contiguous chunks (`training=streams`, truncated BPTT), then scored in every "
             "inference mode; validation bits per character, final weights. Stateful - windowed is paired "
             "target by target (± one standard error); negative where the carried state beats the window.", ""]
    rows = [[name, mode, *(cell(job.number(f"{m}_bpc"), "{:.4f}".format) for m in MODES_BY_CONTEXT),
             plus_minus(job.number("state_gain_bpc"), job.number("state_gain_se"), 5, "+"),
             cell(job.number("train_seconds"), duration)]
            for name, modes in grid.items() for mode, job in modes.items()]
    lines += table(["model", "training", *MODES_BY_CONTEXT, "stateful - windowed", "training time"], rows, "llr")
    lines += [""] + [f"- {name}: {_settings(next(iter(modes.values())))}" for name, modes in grid.items()]
    lines += ["", image("bits per character by training mode and inference mode", PLOT_GRID, plots, "no grid figure."),
              ""]
    return lines


def plot_training_grid(jobs, path: Path) -> Path | None:
    """One panel per model: the inference modes on the x axis, one bar per training mode."""
    grid = grid_models(jobs)
    if not grid:
        return None
    fig, axes = subplots(1, len(grid), figsize=(4.2 * len(grid), 3.8), squeeze=False)
    for ax, (name, modes) in zip(axes[0], grid.items()):
        # grid_models' order: windows, then streams, each by its window; a missing figure: a bar labelled 0.000
        grouped_bars(ax, {f"trained on {mode}": [job.number(f"{m}_bpc") or 0.0 for m in MODES_BY_CONTEXT]
                          for mode, job in modes.items()}, digits=3)
        ax.set_xticks(range(len(MODES_BY_CONTEXT)), [f"{m}\n(inference)" for m in MODES_BY_CONTEXT])
        finish(ax, 7, "y", title=name, ylabel="validation bits per character")
    return save(fig, path)


SECTION = Section("training grid", grid_section, plots={PLOT_GRID: plot_training_grid})
