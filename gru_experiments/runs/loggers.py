"""Experiment loggers: W&B offline-first (a machine with no W&B login never prompts or fails), and each run's learning
curves in its own history.csv whatever the logger (docs/outputs.md)."""

import csv
import hashlib
import io
import math
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_write

# The modes wandb accepts (wandb.sdk.wandb_settings.Settings.mode), and its older spellings.
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")


def wandb_mode() -> str:
    """WANDB_MODE if set (one wandb would refuse, the empty one too, a UserError); else online when credentials
    exist (env or ~/.netrc); else offline."""
    if "WANDB_MODE" in os.environ:
        mode = os.environ["WANDB_MODE"]
        if mode not in WANDB_MODES:
            shown = "'' (an empty string)" if not mode else repr(mode)
            raise UserError(f"invalid WANDB_MODE={shown} (environment variable): must be online, offline or disabled "
                            f"(wandb also takes {', '.join(WANDB_MODES[3:])}), or unset (unset WANDB_MODE: online "
                            "with W&B credentials, offline without); logger=csv or logger=none do without W&B")
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


# Lightning's lines and warnings that say nothing a user can act on (tips, absent hardware, its own bookkeeping and
# deprecations, a checkpoint's metric before the first validation, a resume's folder), or what the run says itself
# (its "device:" line, the steps in its closing line).
QUIET_LINES = ("💡 Tip:", "TPU available", "HPU available", "Loading `train_dataloader` to estimate",
               "GPU available: ", "`Trainer.fit` stopped: `max_steps=", "`Trainer.fit` stopped: `max_epochs=")
QUIET_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"`ModelCheckpoint\(monitor=.*could not find",
                  r"Checkpoint directory .* exists and is not empty")


def quiet_console() -> None:
    """Each line once (Lightning's console handler goes while the root logger has Hydra's), QUIET_* left out."""
    import logging
    import warnings

    lightning = logging.getLogger("lightning")
    if any(type(handler) is logging.StreamHandler for handler in logging.getLogger().handlers):
        for handler in [h for h in lightning.handlers if type(h) is logging.StreamHandler]:
            lightning.removeHandler(handler)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        emitter = logging.getLogger(name)
        if _quiet_line not in emitter.filters:
            emitter.addFilter(_quiet_line)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def _quiet_line(record) -> bool:
    return not any(line in record.getMessage() for line in QUIET_LINES)


def is_wandb(logger) -> bool:
    return type(logger).__name__ == "WandbLogger"


def names_wandb(target) -> bool:
    """Whether a logger group's _target_ builds W&B's logger (a logger built: is_wandb)."""
    return str(target).endswith("WandbLogger")


def figure_metrics(record: dict, skip=(), prefix: str = "") -> dict[str, float]:
    """Every finite number of a summary's record as a metric named by its path, / between keys
    (`cache/by_size/1024/gain_bpc`); lists, strings, booleans, nulls and the paths in `skip` left out."""
    metrics = {}
    for key, value in record.items():
        path = f"{prefix}{key}"
        if path in skip:
            continue
        if isinstance(value, dict):
            metrics |= figure_metrics(value, skip, f"{path}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics[path] = value
    return metrics


def multirun_sweep_dir() -> str | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():  # (not jobs.multirun_job: jobs imports this module)
        return None
    return str(HydraConfig.get().sweep.dir) if HydraConfig.get().mode == RunMode.MULTIRUN else None


def sweep_group(group: str | None, sweep_dir) -> str:
    return group or Path(sweep_dir).resolve().name


# What says how a run ran, not what it trained or measured: runs that differ in these alone are trainings of one
# setting (W&B's job_type here, the report's rows in report/seed_groups.py), resumed on another device or not.
HOW_IT_RAN = ("seed", "resume", "ckpt_path", "logger", "paths", "cuda_graphs", "trainer.accelerator",
              "trainer.devices", "trainer.enable_progress_bar", "trainer.enable_model_summary")


def how_it_ran(key: str) -> bool:
    """Whether a dotted config key (or an override's, + or ~ stripped) is one of HOW_IT_RAN or below one."""
    key = key.lstrip("+~")
    return any(key == k or key.startswith(k + ".") for k in HOW_IT_RAN)


def setting_name() -> str | None:
    """A multirun job's setting: its command-line overrides but HOW_IT_RAN ("model=astra_alpha,training=streams"),
    shared by the runs that differ in their seed alone; W&B's job_type, at most 64 characters (a hash past 55)."""
    from hydra.core.hydra_config import HydraConfig

    if multirun_sweep_dir() is None:
        return None
    name = ",".join(o for o in HydraConfig.get().overrides.task if not how_it_ran(o.split("=", 1)[0]))
    name = name or "default"
    return name if len(name) <= 64 else f"{name[:55]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def build_logger(settings: dict | None, hyperparameters: dict, wandb_id: str | None = None,
                 csv_version: str | None = None):
    """The Lightning logger of the logger group's `settings` (False: logger=none); a resume passes its W&B run id,
    and a CSV version folder of its own (CSVLogger deletes an existing metrics.csv)."""
    if not settings or "_target_" not in settings:
        return False
    kwargs, target = {}, settings["_target_"]
    if names_wandb(target):
        kwargs["mode"] = wandb_mode()
        if wandb_id:
            kwargs["id"] = wandb_id
        if settings.get("group") is None and (sweep_dir := multirun_sweep_dir()):
            kwargs["group"] = sweep_group(None, sweep_dir)  # all jobs of one sweep in one W&B group
        if settings.get("job_type") is None and (setting := setting_name()):
            kwargs["job_type"] = setting  # a setting's seeds side by side: W&B groups the runs by it
        os.makedirs(settings["save_dir"], exist_ok=True)
    if target.endswith("CSVLogger") and csv_version:
        kwargs["version"] = csv_version
    logger = instantiate(settings, **kwargs)
    if is_wandb(logger) and logger._wandb_init.get("anonymous") is None:
        del logger._wandb_init["anonymous"]  # Lightning passes anonymous=None, which wandb warns has no effect
    logger.log_hyperparams(hyperparameters)
    return logger


FIELDS = ["step", "epoch", "metric", "value"]
VAL_METRICS = ("val/loss", "val/bpc", "val/stateful_bpc", "val/stateless_bpc", "val/stateful_word_validity",
               "val/stateless_word_validity")


class MetricsHistory(Callback):
    """The mean training loss every log_every_n_steps and the validation metrics (rank zero). The loss's running sums
    travel in the checkpoint, so a resumed run's first mean is the uninterrupted run's (and its rows: `setup`)."""

    def __init__(self, path: Path, resumed_at: int | None = None):
        self.path = Path(path)
        self._loss_sum, self._loss_count = 0.0, 0  # a tensor once training runs: no host sync per step
        self._resumed_at, self._written = resumed_at, None  # a resume's step; the metrics history.csv holds there

    def setup(self, trainer, pl_module, stage: str) -> None:
        """A resume's history.csv cut back to step `resumed_at` (once, rank zero), its metrics there not repeated."""
        if self._resumed_at is not None and self._written is None and trainer.is_global_zero:
            self._written = keep_history_until(self.path, self._resumed_at)

    def state_dict(self) -> dict:
        return {"loss_sum": float(self._loss_sum), "loss_count": self._loss_count}  # a host sync per checkpoint

    def load_state_dict(self, state: dict) -> None:
        self._loss_sum, self._loss_count = state["loss_sum"], state["loss_count"]

    def _append(self, trainer, rows: list[tuple[str, float]]) -> None:
        if trainer.global_step == self._resumed_at and self._written:
            rows = [(name, value) for name, value in rows if name not in self._written]
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


def keep_history_until(path: Path, step: int) -> set[str]:
    """history.csv cut back, atomically, to its whole rows at or before `step`; the metrics it keeps at `step`."""
    path = Path(path)
    if not path.is_file():
        return set()
    kept = [row for row in _whole_rows(path) if int(row[0]) <= step]
    text = io.StringIO()
    csv.writer(text).writerows([FIELDS, *kept])
    atomic_write(path, text.getvalue())
    return {row[2] for row in kept if int(row[0]) == step}


def _whole_rows(path: Path) -> list[list[str]]:
    """history.csv's rows, but those a kill cut short (no line end, a field missing or half written)."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(True)[1:]:
        try:
            row = next(csv.reader([line]), [])
            if line.endswith("\n") and len(row) == len(FIELDS):
                int(row[0]), float(row[3])
                rows.append(row)
        except (csv.Error, ValueError):
            pass
    return rows


def read_history(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]}; {} without the file; rows a kill cut short are skipped."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, _, metric, value in _whole_rows(Path(path)) if Path(path).is_file() else []:
        if math.isfinite(float(value)):
            series.setdefault(metric, []).append((int(step), float(value)))
    return series
