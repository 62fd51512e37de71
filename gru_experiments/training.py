"""One training run, from a composed config to summary.json."""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from gru_experiments.data import CorpusDataModule, prepare_corpus
from gru_experiments.evaluation import score_windows
from gru_experiments.history import FILENAME as HISTORY_FILENAME
from gru_experiments.history import MetricsHistory
from gru_experiments.lightning_module import LanguageModelTask
from gru_experiments.loggers import build_logger, finish, is_wandb
from gru_experiments.model import count_parameters


def write_json(path: Path, payload: dict) -> None:
    """Write-then-rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def train(cfg: DictConfig) -> dict:
    """Train, score and summarise one model. A run that fails still leaves a summary.json
    (status "failed" and the error) and a failed W&B run, then re-raises: in a multirun the
    other jobs go on, and the sweep report lists this one as failed."""
    started = time.perf_counter()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    logger, exit_code = False, 1
    try:
        # The logger comes first, so that a failure in data preparation is recorded in W&B too.
        logger = build_logger(cfg.get("logger"), cfg)
        corpus = prepare_corpus(cfg.data, cfg.tokenizer, Path(cfg.paths.data_dir) / "tokenizers")
        tokenizer = corpus.tokenizer
        datamodule = CorpusDataModule(corpus.train_ids, corpus.val_ids, cfg.data.batch_size, cfg.data.seq_len,
                                      cfg.data.steps_per_epoch, seed=cfg.seed,
                                      eval_batch_size=cfg.data.eval_batch_size)
        task = LanguageModelTask(
            architecture=OmegaConf.to_container(cfg.model.architecture, resolve=True),
            vocab_size=tokenizer.vocab_size, lr=cfg.model.lr, weight_decay=cfg.weight_decay,
            epochs=cfg.model.epochs, model_name=cfg.model.name, tokenizer=tokenizer,
        )
        parameters = count_parameters(task.model)
        print(f"model {cfg.model.name}: {cfg.model.architecture.cell} cell, {tokenizer.kind} tokenizer, "
              f"vocabulary {tokenizer.vocab_size}, corpus {corpus.source}")
        print(f"trainable parameters: {parameters:,}")

        checkpoint = ModelCheckpoint(dirpath=output_dir / "checkpoints", filename="best-epoch{epoch}-step{step}",
                                     auto_insert_metric_name=False, monitor="val/loss", mode="min",
                                     save_top_k=1, save_last=True)
        history = MetricsHistory(output_dir / HISTORY_FILENAME)  # learning curves for the sweep report
        if logger:
            logger.log_metrics({"parameters": parameters})
        trainer = instantiate(cfg.trainer, logger=logger, callbacks=[checkpoint, history])
        trainer.fit(task, datamodule=datamodule)

        # The final model on the whole validation split (also when max_steps stopped mid-epoch).
        # Every DDP rank holds the same weights and scores the same split by itself (no collective
        # calls, nothing to wait for); only rank zero writes.
        task.to(trainer.strategy.root_device)
        val = score_windows(task.model, datamodule.val_ids, cfg.data.seq_len, cfg.data.eval_batch_size,
                            task.token_char_lengths)
        summary = {
            "status": "completed",
            "model": cfg.model.name,
            "cell": cfg.model.architecture.cell,
            "tokenizer": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "parameters": parameters,
            "train_loss": task.last_epoch_train_loss,
            "val_loss": val.nll,
            "val_bpc": val.bpc,
            "tokens_per_second": task.tokens_per_second,  # per process: times world_size under DDP
            "train_steps": trainer.global_step,
            "world_size": trainer.world_size,
            "wall_seconds": time.perf_counter() - started,
            "device": str(trainer.strategy.root_device),
            "checkpoint": checkpoint.last_model_path or None,
            "best_checkpoint": checkpoint.best_model_path or None,
            "run_dir": str(output_dir),
        }
        if trainer.is_global_zero:
            write_json(output_dir / "summary.json", summary)
            if is_wandb(logger):
                logger.experiment.summary.update({k: v for k, v in summary.items() if v is not None})
            print(format_summary(summary))
        exit_code = 0
        return summary
    except Exception as error:
        if rank_zero_only.rank == 0:  # also before a Trainer exists
            record_failure(cfg, logger, output_dir, error, time.perf_counter() - started)
        raise
    finally:
        finish(logger, exit_code)


def record_failure(cfg: DictConfig, logger, output_dir: Path, error: Exception, wall_seconds: float) -> None:
    """summary.json with status "failed", the error and where it happened; the same in W&B."""
    summary = {
        "status": "failed",
        "model": OmegaConf.select(cfg, "model.name"),
        "cell": OmegaConf.select(cfg, "model.architecture.cell"),
        "tokenizer": OmegaConf.select(cfg, "tokenizer.kind"),
        "error": f"{type(error).__name__}: {error}",
        "traceback": traceback.format_exc(limit=-8),
        "wall_seconds": wall_seconds,
        "run_dir": str(output_dir),
    }
    write_json(output_dir / "summary.json", summary)
    if is_wandb(logger):
        # Bookkeeping must never hide the error it reports.
        with contextlib.suppress(Exception):
            logger.experiment.summary.update({"status": "failed", "error": summary["error"]})


def format_summary(summary: dict) -> str:
    return (f"{summary['model']}: train loss {summary['train_loss']:.4f} | val loss {summary['val_loss']:.4f} "
            f"| val bpc {summary['val_bpc']:.4f} | {summary['tokens_per_second']:,.0f} tokens/s "
            f"| {summary['wall_seconds']:.1f} s | summary: {summary['run_dir']}/summary.json")
