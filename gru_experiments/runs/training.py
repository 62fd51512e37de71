"""One training run, from a composed config to summary.json."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from gru_experiments.runs.checkpoints import AtomicCheckpointIO, NonFiniteWeights, TrainingState, read_checkpoint
from gru_experiments.runs.config import validate
from gru_experiments.data.batches import CorpusDataModule
from gru_experiments.data.corpus import prepare_corpus
from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.runs.estimate import CostEstimate
from gru_experiments.study.inference import MODES
from gru_experiments.study.scores import Split, score_chunks
from gru_experiments.study.context_curve import curve_points, format_curve
from gru_experiments.study.evaluation import describe_sample, evaluate, format_modes, whole_split
from gru_experiments.runs.history import MetricsHistory
from gru_experiments.study.inference import (STUDY_PROMPTS, Decoding, side_by_side_samples, spellable_prompts,
                                       tokens_for_chars)
from gru_experiments.runs.task import LanguageModelTask, load_checkpoint
from gru_experiments.runs.jobs import job
from gru_experiments.runs.loggers import build_logger, is_wandb
from gru_experiments.models.protocol import count_parameters
from gru_experiments.models.precision import apply_matmul_precision
from gru_experiments.study.progress import NO_PROGRESS, Progress
from gru_experiments.runs.resume import resume_point
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.smoke import is_smoke, smoke_config, smoke_split


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


def training_batching(cfg: DictConfig) -> str:
    """training.batching: windows (random windows, each from the initial state; the default, also for
    configs written before the choice existed) or streams (truncated BPTT)."""
    return OmegaConf.select(cfg, "training.batching", default=None) or "windows"


def train(cfg: DictConfig) -> dict:
    """Train, score and summarise one model.

    Bad input (config values, the corpus, a resume checkpoint) is refused before anything is
    written. Runs inside jobs.job: a multirun job that fails still leaves a summary.json (status
    "failed" and the error) and a failed W&B run, then re-raises, so the other jobs go on and
    the sweep report lists this one as failed. A single run that fails just raises; its
    checkpoints stay, ready for resume=."""
    with job(cfg, record=True) as current:
        return _train(cfg, current)


def _train(cfg: DictConfig, current) -> dict:
    validate(cfg)  # bad values fail here, before any work
    cfg = smoke_config(cfg)  # trainer.fast_dev_run: the whole pipeline on a small slice (smoke.py)
    resume = resume_point(cfg)
    run = RunDir(cfg.paths.output_dir)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    corpus = prepare_corpus(cfg.data, cfg.tokenizer, Path(cfg.paths.data_dir) / "tokenizers")
    tokenizer = corpus.tokenizer
    recipe = {key: cfg.model.get(key) for key in ("lr", "epochs")}  # None for a counted model
    task = LanguageModelTask(
        architecture=OmegaConf.to_container(cfg.model.architecture, resolve=True),
        vocab_size=tokenizer.vocab_size, weight_decay=cfg.weight_decay if recipe["lr"] else None,
        model_name=cfg.model.name, tokenizer=tokenizer, **recipe,
    )
    model = task.model
    batching = training_batching(cfg)
    datamodule = CorpusDataModule(corpus.train_ids, smoke_split(corpus.val_ids, cfg), cfg.data.batch_size,
                                  cfg.data.seq_len, cfg.data.steps_per_epoch, seed=cfg.seed,
                                  eval_batch_size=cfg.data.eval_batch_size,
                                  batching=batching if model.trainable else "windows")  # counted: no batches
    val_split = Split.of(datamodule.val_ids, tokenizer)
    task.track_modes(val_split, cfg.data.seq_len, int(cfg.evaluation.streams),  # history.csv: modes over training
                     cfg.evaluation.get("validation_tokens"))
    if model.context is not None and datamodule.train_ids.numel() < model.context + 1:
        raise UserError(f"the training split has {datamodule.train_ids.numel()} tokens, fewer than one context "
                        f"of {cfg.model.name} ({model.context} tokens and the one they predict); use a longer "
                        "corpus or a smaller context")
    print(f"model {cfg.model.name}: {model.family}, {tokenizer.kind} tokenizer, "
          f"vocabulary {tokenizer.vocab_size}, corpus {corpus.source}")
    if is_smoke(cfg):
        print(f"fast_dev_run: a smoke run on a small slice (the first {val_split.n_targets + 1:,} validation "
              "tokens, small batches, a sampled evaluation): its figures say nothing about the model")
    parameters = count_parameters(model) if model.trainable else None  # a counted model: after counting
    if parameters is not None:
        print(f"trainable parameters: {parameters:,}")
    if batching == "streams" and not model.trainable:
        print(f"training=streams: {cfg.model.name} is counted, not trained; its counts are the same either way")

    if resume is not None:
        resume.check(task.hparams, tokenizer)
        print(f"resuming from {resume.checkpoint} (step {resume.step})")

    run.path.mkdir(parents=True, exist_ok=True)  # only now: input errors above leave nothing behind
    checkpoint, *more_checkpoints = checkpoint_callbacks(
        run.checkpoint_dir, OmegaConf.select(cfg, "checkpoint.every_n_steps", default=0))
    checkpoint_io = AtomicCheckpointIO()
    logger = current.logger = build_logger(
        cfg.get("logger"), cfg, wandb_id=resume and resume.wandb_run_id,
        csv_version=None if resume is None else f"resumed_step{resume.step}")
    if logger and resume is None and parameters is not None:
        logger.log_metrics({"parameters": parameters})
    history = MetricsHistory(run.history_file)  # learning curves for the sweep report
    cost = CostEstimate(val_split.n_targets, cfg.data.seq_len, cfg.data.batch_size, cfg.evaluation, model=model)
    trainer = instantiate(cfg.trainer, logger=logger, plugins=[checkpoint_io],
                          callbacks=[checkpoint, *more_checkpoints, TrainingState(), history, cost])
    # bf16 matmul inputs where low_precision_matmuls and the hardware say so (precision.py).
    precision_used = apply_matmul_precision(model, cfg.get("low_precision_matmuls") or "never",
                                            cfg.trainer.get("precision"), trainer)
    print(f"precision: {precision_used['precision']}, matmuls in {precision_used['matmul_dtype']}")
    counted_checkpoint = None
    if not model.trainable:  # counted, not trained: count the training split, validate once, save
        counted_checkpoint = count_and_save(trainer, task, datamodule, run)
        parameters = count_parameters(model)
        print(f"counted {task.train_tokens:,} training tokens in {task.train_seconds:.2f} s; "
              f"stored numbers: {parameters:,}")
        if logger:
            logger.log_metrics({"parameters": parameters})
    else:
        try:
            # The one full read of a resumed checkpoint: Lightning's, through checkpoint_io, which loads
            # weights only whatever Lightning asks for (not every Lightning this project accepts has
            # fit(weights_only=)).
            trainer.fit(task, datamodule=datamodule, ckpt_path=resume and resume.checkpoint)
        except TrainingDiverged as err:
            if isinstance(err, NonFiniteWeights):
                raise  # its message already says which checkpoint was kept
            raise TrainingDiverged(_diverged_message(err, checkpoint_io)) from err
        keep_final_weights(trainer, run, (checkpoint, *more_checkpoints))

    # The final model on the whole validation split: the last validation pass when it scored
    # these weights on every target, else (max_steps stopped mid-epoch, fast_dev_run) one more.
    # Every DDP rank holds the same weights and scores the same split by itself (no collective
    # calls, nothing to wait for); only rank zero writes.
    task.to(trainer.strategy.root_device)
    val = task.last_val_score
    val_is_final = task.last_val_step == trainer.global_step and val is not None and val.tokens == val_split.n_targets
    if not val_is_final:
        val = score_chunks(task.model, val_split.to(task.device), cfg.data.seq_len, cfg.data.eval_batch_size)
    summary = {
        "status": "completed",
        "smoke": is_smoke(cfg),  # trainer.fast_dev_run: figures of a small slice (smoke.py)
        "model": cfg.model.name,
        "cell": model.family,
        "tokenizer": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "parameters": parameters,
        "context": model.context,  # tokens the model can see; None: unbounded (recurrent)
        "training_mode": batching if model.trainable else "counted",  # windows | streams (truncated BPTT)
        "train_loss": task.last_epoch_train_loss if model.trainable else None,  # counted: no training loss
        "val_loss": val.nll,
        "val_bpc": val.bpc,
        "tokens_per_second": task.tokens_per_second,  # per process: times world_size under DDP
        "train_seconds": task.train_seconds,  # the training steps (or the counting) alone
        "train_steps": trainer.global_step,
        "world_size": trainer.world_size,
        "wall_seconds": current.seconds,
        "device": str(trainer.strategy.root_device),
        **precision_used,
        "checkpoint": counted_checkpoint or next(
            (c.last_model_path for c in (checkpoint, *more_checkpoints) if c.last_model_path), None),
        "best_checkpoint": checkpoint.best_model_path or None,
        "run_dir": str(run.path),
        "resumed_from_step": resume and resume.step,
    }
    if trainer.is_global_zero:
        samples = evaluate_inference_modes(cfg, task, datamodule, val_split, summary, logger,
                                           stateful=task.last_mode_scores.get("stateful") if val_is_final else None)
        summary["wall_seconds"] = current.seconds  # the whole run, the evaluation included
        run.write_summary(summary)
        run.write_samples(samples)
        if is_wandb(logger):
            logger.experiment.summary.update({k: v for k, v in summary.items() if v is not None})
        print(format_summary(summary))
    return summary


def evaluate_inference_modes(cfg: DictConfig, task: LanguageModelTask, datamodule: CorpusDataModule, val: Split,
                             summary: dict, logger, stateful=None) -> dict:
    """The study's comparison on the final weights: the validation split scored stateful,
    stateless and windowed (windowed and the curve on a sample under evaluation.max_tokens), against the training split's bigram table (nll and bpc added to
    `summary`), the context curve (`summary["context_curve"]`), the best checkpoint in every
    mode (`summary["best"]`), and short seeded stateful/stateless samples side by side (returned).
    `stateful`: the final weights' stateful score when the last validation already computed it.
    Shows a progress bar per pass (trainer.enable_progress_bar) and records `eval_seconds`."""
    started = time.perf_counter()
    summary["train_tokens"] = (summary["train_steps"] * cfg.data.batch_size * cfg.data.seq_len
                               if task.model.trainable else task.train_tokens)
    progress = Progress(enabled=bool(cfg.trainer.get("enable_progress_bar", True)))
    evaluation = evaluate(task.model, datamodule.train_ids, val, cfg.data.seq_len, cfg.evaluation,
                          summary["train_tokens"], stateful=stateful, progress=progress)
    metrics = evaluation.metrics()
    summary.update(metrics)
    summary["mode_evaluation"] = evaluation.settings
    summary["context_curve"] = evaluation.curve
    summary["best"] = score_best(cfg, summary, datamodule.train_ids, val, task.device,
                                 Progress(progress.enabled, "evaluation, best checkpoint"))
    samples = side_by_side_samples(
        task.model, task.tokenizer, spellable_prompts(task.tokenizer, STUDY_PROMPTS, datamodule.val_ids),
        max_new_tokens=tokens_for_chars(cfg.evaluation.sample_chars, val),
        decoding=Decoding(temperature=cfg.evaluation.sample_temperature), seed=cfg.seed)
    summary["eval_seconds"] = time.perf_counter() - started

    summary["eval_whole_split"] = whole_split(evaluation.settings, evaluation.curve)
    print(f"inference modes on {describe_sample(evaluation.settings, evaluation.curve)}, final weights "
          f"(step {summary['train_steps']}; {evaluation.settings}; {summary['eval_seconds']:.1f} s):\n"
          f"{format_modes(evaluation.scores)}")
    if evaluation.gain is not None:
        print(f"stateful - windowed ({evaluation.settings['window']} tokens), paired on "
              f"{evaluation.gain.tokens:,} targets: {evaluation.gain.bpc:+.4f} ± {evaluation.gain.bpc_se:.4f} bits/char")
    print(f"context curve, final weights (bits per character against the tokens of context):\n"
          f"{format_curve(evaluation.curve)}")
    print(format_best(summary["best"]))
    for prompt, stateful_text, stateless_text in zip(samples["prompts"], samples["stateful"], samples["stateless"]):
        print(f"--- {prompt!r} stateful:\n{stateful_text}\n--- {prompt!r} stateless:\n{stateless_text}")
    if logger:
        logger.log_metrics({f"modes/{k}": v for k, v in metrics.items()}, step=task.global_step)
        logger.log_metrics({f"context_curve/{k}": v for k, v in curve_points(evaluation.curve)}, step=task.global_step)
        logger.log_metrics({f"best/{k}": v for k, v in summary["best"].items() if isinstance(v, (int, float))
                            and not isinstance(v, bool)}, step=task.global_step)
        if is_wandb(logger):
            log_curve_to_wandb(logger, evaluation.curve, summary["model"])
            logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                             data=[list(row) for row in zip(samples["prompts"], samples["stateful"],
                                                            samples["stateless"])])
        logger.save()
    return samples


def score_best(cfg: DictConfig, summary: dict, train_ids, val: Split, device, progress=NO_PROGRESS) -> dict:
    """The best checkpoint (lowest val/loss) scored in every mode, beside the final weights:
    {"step", "checkpoint", "same_as_final", "val_loss", "val_bpc", "<mode>_nll", "<mode>_bpc"}.
    When the best checkpoint holds the final weights (or there is none: a counted model), its
    figures are the final ones, not scored twice."""
    final_step = summary["train_steps"]
    path = summary.get("best_checkpoint")
    step = read_checkpoint(path, mmap=True).get("global_step") if path else final_step
    keys = ["val_loss", "val_bpc", *(f"{mode}_{unit}" for mode in MODES for unit in ("nll", "bpc"))]
    best = {"step": step, "checkpoint": path or summary.get("checkpoint"), "same_as_final": step == final_step}
    if step == final_step:
        return best | {key: summary.get(key) for key in keys}
    model = load_checkpoint(path, map_location=device).model.to(device)
    val = val.to(device)
    chunks = score_chunks(model, val, cfg.data.seq_len, cfg.data.eval_batch_size)
    evaluation = evaluate(model, train_ids, val, cfg.data.seq_len, cfg.evaluation, summary["train_tokens"],
                          curve=False, progress=progress)
    metrics = evaluation.metrics()
    return best | {"val_loss": chunks.nll, "val_bpc": chunks.bpc} | {key: metrics[key] for key in keys[2:]}


def format_best(best: dict) -> str:
    if best["same_as_final"]:
        return f"best checkpoint by val/loss: the final weights (step {best['step']})"
    figures = ", ".join(f"{key.removesuffix('_bpc')} {best[key]:.4f}" for key in
                        ("val_bpc", *(f"{mode}_bpc" for mode in MODES)))
    return f"best checkpoint by val/loss (step {best['step']}), bits per character: {figures}"


def log_curve_to_wandb(logger, curve: dict, model_name: str) -> None:
    """The context curve as a W&B line plot (windowed points against the context) and a table."""
    import wandb

    rows = [[int(key), value] for key, value in curve_points(curve) if key.isdigit()]
    table = wandb.Table(columns=["context_tokens", "bpc"], data=rows)
    logger.experiment.log({
        "context_curve/table": table,
        "context_curve/plot": wandb.plot.line(table, "context_tokens", "bpc",
                                              title=f"{model_name}: bits per character against context "
                                                    f"(stateful: {curve['stateful']:.4f})"),
    })


def keep_final_weights(trainer, run: RunDir, callbacks) -> None:
    """trainer.max_steps can stop training between two checkpoints (neither an epoch end nor a
    multiple of checkpoint.every_n_steps); then last.ckpt also gets the final step, so that it
    holds the weights the summary scores. Every rank takes the same decision (saving is collective)."""
    saved = max((getattr(c, "_last_global_step_saved", -1) for c in callbacks), default=-1)
    if trainer.fast_dev_run or saved == trainer.global_step or trainer.global_step == 0:
        return
    trainer.save_checkpoint(run.checkpoint)


def count_and_save(trainer, task: LanguageModelTask, datamodule: CorpusDataModule, run: RunDir) -> str:
    """A counted model's "training": count the training split (timed: tokens/s), score the
    validation split once (val/loss, val/bpc, history.csv), and save checkpoints/last.ckpt through
    the trainer (atomic, with the tokenizer: sample.py loads it like any other). Returns its path."""
    started = time.perf_counter()
    task.model.fit(datamodule.train_ids)
    task.train_seconds = time.perf_counter() - started
    task.train_tokens = datamodule.train_ids.numel()
    trainer.validate(task, datamodule=datamodule, verbose=False)
    trainer.save_checkpoint(run.checkpoint)
    return str(run.checkpoint)


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
