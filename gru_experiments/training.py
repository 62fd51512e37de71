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

from gru_experiments.checkpoints import (TRAINING_KEYS, AtomicCheckpointIO, NonFiniteWeights, TrainingState,
                                         check_tokenizer, read_checkpoint, wandb_run_id)
from gru_experiments.config_schema import validate
from gru_experiments.data import CorpusDataModule, prepare_corpus
from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.evaluation import evaluate_from_config, format_modes, mode_metrics, score_windows
from gru_experiments.history import FILENAME as HISTORY_FILENAME
from gru_experiments.history import MetricsHistory
from gru_experiments.inference import (STUDY_PROMPTS, Decoding, side_by_side_samples, spellable_prompts,
                                       tokens_for_chars)
from gru_experiments.lightning_module import LanguageModelTask
from gru_experiments.loggers import build_logger, finish, is_wandb, multirun_sweep_dir
from gru_experiments.language_model import count_parameters
from gru_experiments.resume import find_run


def write_json(path: Path, payload: dict) -> None:
    """Write-then-rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def load_resume_checkpoint(cfg: DictConfig) -> tuple[Path, dict] | None:
    """For resume=last|RUN_DIR: the run's last checkpoint, read (weights only) and checked."""
    resume = cfg.get("resume")
    if resume is None:
        return None
    _, path = find_run(resume, cfg.paths.log_dir, cfg.model.name)
    checkpoint = read_checkpoint(path, require=TRAINING_KEYS)
    for leftover in path.parent.glob(".*.ckpt.*.tmp"):  # a save cut short by the kill
        leftover.unlink(missing_ok=True)
    return path, checkpoint


def check_resumable(path: Path, checkpoint: dict, task: LanguageModelTask, tokenizer) -> None:
    """The checkpoint must hold this config's model: same tokenizer and architecture."""
    check_tokenizer(checkpoint, path, tokenizer=tokenizer)
    saved = checkpoint["hyper_parameters"]
    for key in ("architecture", "vocab_size"):
        if saved.get(key) != task.hparams[key]:
            raise UserError(f"checkpoint {path} holds a model with {key} {saved.get(key)}, but this config builds "
                            f"{task.hparams[key]}; resume with the run's own model settings")


def checkpoint_callbacks(dirpath: Path, every_n_steps: int) -> tuple[ModelCheckpoint, ...]:
    """The best checkpoint by val/loss (after each validation) and last.ckpt, written at every
    epoch end and, so that a kill loses little, every `every_n_steps` training steps.

    Both callbacks write the same last.ckpt (no -v1 copies: the version counter is off), and
    every write is atomic (AtomicCheckpointIO).
    """
    best = ModelCheckpoint(dirpath=dirpath, filename="best-epoch{epoch}-step{step}", auto_insert_metric_name=False,
                           monitor="val/loss", mode="min", save_top_k=1, save_last=True,
                           enable_version_counter=False)
    if not every_n_steps:
        return (best,)
    periodic = ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True, every_n_train_steps=every_n_steps,
                               enable_version_counter=False)
    return best, periodic


def train(cfg: DictConfig) -> dict:
    """Train, score and summarise one model.

    Bad input (config values, the corpus, a resume checkpoint) is refused before anything is
    written. A multirun job that fails still leaves a summary.json (status "failed" and the
    error) and a failed W&B run, then re-raises: the other jobs go on, and the sweep report
    lists this one as failed. A single run that fails just reports it; its checkpoints stay,
    ready for resume=."""
    started = time.perf_counter()
    validate(cfg)  # bad values fail here, before any work
    resume = load_resume_checkpoint(cfg)
    output_dir = Path(cfg.paths.output_dir)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    logger, exit_code = False, 1
    try:
        corpus = prepare_corpus(cfg.data, cfg.tokenizer, Path(cfg.paths.data_dir) / "tokenizers")
        tokenizer = corpus.tokenizer
        datamodule = CorpusDataModule(corpus.train_ids, corpus.val_ids, cfg.data.batch_size, cfg.data.seq_len,
                                      cfg.data.steps_per_epoch, seed=cfg.seed,
                                      eval_batch_size=cfg.data.eval_batch_size)
        recipe = {key: cfg.model.get(key) for key in ("lr", "epochs")}
        task = LanguageModelTask(
            architecture=OmegaConf.to_container(cfg.model.architecture, resolve=True),
            vocab_size=tokenizer.vocab_size, weight_decay=cfg.weight_decay if recipe["lr"] else None,
            model_name=cfg.model.name, tokenizer=tokenizer, **recipe,
        )
        model = task.model
        if model.context is not None and datamodule.train_ids.numel() < model.context + 1:
            raise UserError(f"the training split has {datamodule.train_ids.numel()} tokens, fewer than one context "
                            f"of {cfg.model.name} ({model.context} tokens and the one they predict); use a longer "
                            "corpus or a smaller context")
        print(f"model {cfg.model.name}: {model.family}, {tokenizer.kind} tokenizer, "
              f"vocabulary {tokenizer.vocab_size}, corpus {corpus.source}")
        parameters = count_parameters(model) if model.trainable else None  # a counted model: after counting
        if parameters is not None:
            print(f"trainable parameters: {parameters:,}")

        resume_path, resumed_step, run_id = None, None, None
        if resume is not None:
            resume_path, saved = resume
            check_resumable(resume_path, saved, task, tokenizer)
            resumed_step, run_id = saved["global_step"], wandb_run_id(saved)
            del saved, resume  # free it: Lightning reads the file again itself
            print(f"resuming from {resume_path} (step {resumed_step})")

        output_dir.mkdir(parents=True, exist_ok=True)  # only now: input errors above leave nothing behind
        checkpoint, *more_checkpoints = checkpoint_callbacks(
            output_dir / "checkpoints", OmegaConf.select(cfg, "checkpoint.every_n_steps", default=0))
        checkpoint_io = AtomicCheckpointIO()
        logger = build_logger(cfg.get("logger"), cfg, wandb_id=run_id,
                              csv_version=None if resumed_step is None else f"resumed_step{resumed_step}")
        if logger and resumed_step is None and parameters is not None:
            logger.log_metrics({"parameters": parameters})
        history = MetricsHistory(output_dir / HISTORY_FILENAME)  # learning curves for the sweep report
        trainer = instantiate(cfg.trainer, logger=logger, plugins=[checkpoint_io],
                              callbacks=[checkpoint, *more_checkpoints, TrainingState(), history])
        counted_checkpoint = None
        if not model.trainable:  # counted, not trained: count the training split, validate once, save
            counted_checkpoint = count_and_save(trainer, task, datamodule, output_dir / "checkpoints")
            parameters = count_parameters(model)
            print(f"counted {task.train_tokens:,} training tokens in {task.train_seconds:.2f} s; "
                  f"stored numbers: {parameters:,}")
            if logger:
                logger.log_metrics({"parameters": parameters})
        else:
            try:
                # Lightning reads ckpt_path through checkpoint_io, which loads weights only whatever
                # Lightning asks for (not every Lightning this project accepts has fit(weights_only=)).
                trainer.fit(task, datamodule=datamodule, ckpt_path=resume_path)
            except TrainingDiverged as err:
                if isinstance(err, NonFiniteWeights):
                    raise  # its message already says which checkpoint was kept
                raise TrainingDiverged(_diverged_message(err, checkpoint_io)) from err

        # The final model on the whole validation split: the last validation pass when it scored
        # these weights on every target, else (max_steps stopped mid-epoch, fast_dev_run) one more.
        # Every DDP rank holds the same weights and scores the same split by itself (no collective
        # calls, nothing to wait for); only rank zero writes.
        task.to(trainer.strategy.root_device)
        val = task.last_val_score
        if task.last_val_step != trainer.global_step or val.tokens != datamodule.val_ids.numel() - 1:
            val = score_windows(task.model, datamodule.val_ids, cfg.data.seq_len, cfg.data.eval_batch_size,
                                task.token_char_lengths)
        summary = {
            "status": "completed",
            "model": cfg.model.name,
            "cell": model.family,
            "tokenizer": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "parameters": parameters,
            "train_loss": task.last_epoch_train_loss if model.trainable else None,  # counted: no training loss
            "val_loss": val.nll,
            "val_bpc": val.bpc,
            "tokens_per_second": task.tokens_per_second,  # per process: times world_size under DDP
            "train_steps": trainer.global_step,
            "world_size": trainer.world_size,
            "wall_seconds": time.perf_counter() - started,
            "device": str(trainer.strategy.root_device),
            "checkpoint": counted_checkpoint or next(
                (c.last_model_path for c in (checkpoint, *more_checkpoints) if c.last_model_path), None),
            "best_checkpoint": checkpoint.best_model_path or None,
            "run_dir": str(output_dir),
            "resumed_from_step": resumed_step,
        }
        if trainer.is_global_zero:
            samples = evaluate_inference_modes(cfg, task, datamodule, summary, logger)
            write_json(output_dir / "summary.json", summary)
            write_json(output_dir / "samples.json", samples)
            if is_wandb(logger):
                logger.experiment.summary.update({k: v for k, v in summary.items() if v is not None})
            print(format_summary(summary))
        exit_code = 0
        return summary
    except Exception as error:
        if rank_zero_only.rank == 0 and multirun_sweep_dir():  # also before a Trainer exists
            logger = record_failure(cfg, logger, output_dir, error, time.perf_counter() - started)
        raise
    finally:
        finish(logger, exit_code)


def evaluate_inference_modes(cfg: DictConfig, task: LanguageModelTask, datamodule: CorpusDataModule,
                             summary: dict, logger) -> dict:
    """The study's comparison on the final weights: the whole validation split scored stateful,
    stateless and windowed, against the training split's bigram table (nll and bpc added to
    `summary`), and short seeded stateful/stateless samples side by side (returned)."""
    started = time.perf_counter()
    summary["train_tokens"] = (summary["train_steps"] * cfg.data.batch_size * cfg.data.seq_len
                               if task.model.trainable else task.train_tokens)
    scores, settings = evaluate_from_config(task.model, datamodule.train_ids, datamodule.val_ids,
                                            task.token_char_lengths, cfg.data.seq_len, cfg.evaluation,
                                            summary["train_tokens"])
    metrics = mode_metrics(scores)
    summary.update(metrics)
    summary["mode_evaluation"] = settings
    samples = side_by_side_samples(
        task.model, task.tokenizer, spellable_prompts(task.tokenizer, STUDY_PROMPTS, datamodule.val_ids),
        max_new_tokens=tokens_for_chars(cfg.evaluation.sample_chars, datamodule.val_ids, task.token_char_lengths),
        decoding=Decoding(temperature=cfg.evaluation.sample_temperature), seed=cfg.seed)
    summary["evaluation_seconds"] = time.perf_counter() - started

    print(f"inference modes on the whole validation split ({settings}):\n{format_modes(scores)}")
    for prompt, stateful, stateless in zip(samples["prompts"], samples["stateful"], samples["stateless"]):
        print(f"--- {prompt!r} stateful:\n{stateful}\n--- {prompt!r} stateless:\n{stateless}")
    if logger:
        logger.log_metrics({f"modes/{k}": v for k, v in metrics.items()}, step=task.global_step)
        if is_wandb(logger):
            logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                             data=[list(row) for row in zip(samples["prompts"], samples["stateful"],
                                                            samples["stateless"])])
        logger.save()
    return samples


def count_and_save(trainer, task: LanguageModelTask, datamodule: CorpusDataModule, checkpoint_dir: Path) -> str:
    """A counted model's "training": count the training split (timed: tokens/s), score the
    validation split once (val/loss, val/bpc, history.csv), and save checkpoints/last.ckpt through
    the trainer (atomic, with the tokenizer: sample.py loads it like any other). Returns its path."""
    started = time.perf_counter()
    task.model.fit(datamodule.train_ids)
    task.train_seconds = time.perf_counter() - started
    task.train_tokens = datamodule.train_ids.numel()
    trainer.validate(task, datamodule=datamodule, verbose=False)
    path = checkpoint_dir / "last.ckpt"
    trainer.save_checkpoint(path)
    return str(path)


def record_failure(cfg: DictConfig, logger, output_dir: Path, error: Exception, wall_seconds: float):
    """summary.json with status "failed", the error and where it happened; the same in W&B (a run
    is started for it if the failure came before the logger). Returns the logger to finish."""
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
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / "summary.json", summary)
    # Bookkeeping must never hide the error it reports.
    with contextlib.suppress(Exception):
        logger = logger or build_logger(cfg.get("logger"), cfg)
        if is_wandb(logger):
            logger.experiment.summary.update({"status": "failed", "error": summary["error"]})
    return logger


def _diverged_message(err: TrainingDiverged, checkpoint_io: AtomicCheckpointIO) -> str:
    message = str(err)
    if checkpoint_io.last_saved:
        path, step = checkpoint_io.last_saved
        return (f"{message}; stopped, the last good checkpoint is kept: {path} (step {step}); "
                "try a lower model.lr")
    return f"{message}; stopped before any checkpoint was saved; try a lower model.lr"


def format_summary(summary: dict) -> str:
    train_loss = "—" if summary["train_loss"] is None else f"{summary['train_loss']:.4f}"  # None: a counted model
    return (f"{summary['model']}: train loss {train_loss} | val loss {summary['val_loss']:.4f} "
            f"| val bpc {summary['val_bpc']:.4f} | {summary['tokens_per_second']:,.0f} tokens/s "
            f"| {summary['wall_seconds']:.1f} s | summary: {summary['run_dir']}/summary.json")
