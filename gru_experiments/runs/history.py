"""Each run's learning curves in its own history.csv, whatever the logger (the sweep report draws them): one
row per measurement (step,epoch,metric,value), appended as training goes (docs/outputs.md).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from lightning.pytorch.callbacks import Callback

FIELDS = ["step", "epoch", "metric", "value"]
VAL_METRICS = ("val/loss", "val/bpc", "val/stateful_bpc", "val/stateless_bpc", "val/stateful_word_validity",
               "val/stateless_word_validity")


class MetricsHistory(Callback):
    """The mean training loss every log_every_n_steps and the validation metrics (rank zero)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._loss_sum, self._loss_count = 0.0, 0  # a tensor once training runs: no host sync per step

    def _append(self, trainer, rows: list[tuple[str, float]]) -> None:
        if not trainer.is_global_zero or not rows:
            return
        new_file = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new_file:
                writer.writerow(FIELDS)
            writer.writerows((trainer.global_step, trainer.current_epoch, name, f"{value:.6g}") for name, value in rows)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._loss_sum = self._loss_sum + loss.detach()
        self._loss_count += 1
        if trainer.global_step % max(trainer.log_every_n_steps, 1) == 0:
            self._flush_train_loss(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._flush_train_loss(trainer)  # the last steps, when they did not end on a logging step

    def _flush_train_loss(self, trainer) -> None:
        if self._loss_count:
            self._append(trainer, [("train/loss", float(self._loss_sum) / self._loss_count)])
        self._loss_sum, self._loss_count = 0.0, 0

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        self._append(trainer, [(name, float(metrics[name])) for name in VAL_METRICS if name in metrics])


def read_history(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]}; {} without the file; rows a kill cut short are skipped."""
    path = Path(path)
    if not path.is_file():
        return {}
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                step, value = int(row["step"]), float(row["value"])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                series.setdefault(row["metric"], []).append((step, value))
    return series
