"""One training run, from a composed config to summary.json, in named steps: train(cfg, job) resolves a resume and
validates the config into the run's RunSpec (runs/checks.py, runs/spec.py); every step after reads the spec, never
the config. The job (runs/jobs.py: failure handling) is entered once, by the entry point that calls train.

    prepare       read the corpus, build the model and the batches (nothing written): a Run
    (the folder)  a new run's claimed: locked, refused if a run holds it (RunDir.claim; a resume's: resume_run)
    fit_or_count  the run folder, loggers and checkpoints; train the model (or count an n-gram): Fitted
    summarize     the run's record: what was trained, how, and its final validation
    score         the evaluation of the final weights and the best checkpoint, the samples (runs/scoring.py)
    write         summary.json (the record, the figures and the wall time, assembled in train) and samples.json

Each step returns what the next takes; nothing is filled in later.

trainer.fast_dev_run=true is a smoke run: the whole pipeline on a small slice (Lightning's one training and one
validation batch, the first SMOKE_VAL_TOKENS validation tokens), its figures marked "smoke" in summary.json.
"""

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint

from gru_experiments.data.batches import CorpusDataModule
from gru_experiments.data.corpus import load_corpus, prepare_corpus
from gru_experiments.data.tokenizers import decoded_pieces
from gru_experiments.errors import TrainingDiverged
from gru_experiments.files import write_json
from gru_experiments.models.cuda_graphs import cuda_graphs
from gru_experiments.models.precision import apply_matmul_precision
from gru_experiments.models.protocol import count_parameters
from gru_experiments.runs.checkpoints import (
    AtomicCheckpointIO,
    NonFiniteWeights,
    RunCheckpoint,
    StepCheckpoint,
    TrainingState,
    resume_epoch_ends_exactly,
    weight_shapes,
)
from gru_experiments.runs.checks import check_sizes, check_trainer, validate
from gru_experiments.runs.jobs import Job, is_first_rank
from gru_experiments.runs.loggers import MetricsHistory, build_logger, is_wandb, quiet_console
from gru_experiments.runs.resume import resume_run
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.scoring import score_run
from gru_experiments.runs.spec import RunSpec
from gru_experiments.runs.stopping import EarlyStopping, build_early_stopping, stopping_summary
from gru_experiments.runs.task import LanguageModelTask
from gru_experiments.runs.trained_run import TrainedRun
from gru_experiments.runs.training_callbacks import CostEstimate, ModesOverTraining
from gru_experiments.study.scores import Split, score_chunks

SMOKE_VAL_TOKENS = 1024


@dataclass(frozen=True)
class Run:
    """What prepare builds from the spec, before anything is written: the data and the model."""
    spec: RunSpec
    resume: object
    folder: RunDir
    corpus: object
    task: LanguageModelTask
    data: CorpusDataModule
    val: Split  # the validation split the end-of-run evaluation scores
    epoch_val: Split  # its first data.validation_tokens: what every validation over training scores
    parameters: int | None  # trainable parameters; None: a counted model (its stored numbers: Fitted's)
    stopping: EarlyStopping | None = None  # early_stopping.patience=N (conf/early_stopping/); None: off


@dataclass(frozen=True)
class Fitted:
    """What fit_or_count returns: the trainer that trained (or counted) the model, and what it wrote with."""
    trainer: L.Trainer
    checkpoints: tuple
    logger: object
    precision: dict
    parameters: int  # trainable parameters (a counted model: its stored numbers, once counted)


def train(cfg, current: Job) -> dict:
    """Train, score and summarise one model of its composed config (train.py's, api.train's); bad input is refused
    before anything is written. `current`: the run's one job, which its caller entered (jobs.job(cfg, record=True):
    it records a failure, a multirun job's summary.json says "failed", and closes the logger; the checkpoints stay
    for resume=)."""
    with ExitStack() as held:  # held: the run folder's lock (RunDir.hold)
        quiet_console()
        # a resume: the run's own config, with this command's overrides; the run folder's lock taken into `held`
        cfg, resume = resume_run(cfg, held if is_first_rank() else None)
        spec = validate(cfg)  # bad values fail here, before any work
        run = prepare(spec, resume)
        if resume is None and is_first_rank():  # a new run's folder: locked, refused if a run holds it
            held.enter_context(run.folder.claim())
        # On CUDA: the training step and the evaluation's forwards replayed from CUDA graphs (models/cuda_graphs.py)
        with cuda_graphs(run.spec.cuda_graphs):
            fitted = fit_or_count(run, current)
            record = summarize(run, fitted)
            if not fitted.trainer.is_global_zero:  # every DDP rank holds the same weights; rank zero scores, writes
                return record
            figures, samples = score_run(in_memory(run), run.val, record, fitted.logger, run.spec.evaluation,
                                         train_ids=run.data.train_ids, probe=run.corpus.probe,
                                         eval_batch_size=run.spec.eval_batch_size,
                                         progress_bars=run.spec.progress_bars)
        # summary.json, assembled here alone: what was trained and how, the evaluation's figures, the whole wall time
        summary = record | figures | {"wall_seconds": current.seconds}
        write(run.folder, fitted.logger, summary, samples)
        return summary


def in_memory(run: Run) -> TrainedRun:
    """The run's weights in memory as the trained run the evaluation door takes (runs/trained_run.py)."""
    spec = run.spec
    return TrainedRun(run.task.model, run.corpus.tokenizer, spec.model_name, folder=run.folder, data=spec.data,
                      evaluation=spec.resolved_config.get("evaluation"), seed=spec.seed, data_dir=spec.data_dir)


def prepare(spec: RunSpec, resume=None) -> Run:
    """Build the model and its data (`resume`: resume.resume_run's point, checked against them); write nothing, so
    that input errors leave nothing."""
    L.seed_everything(spec.seed, workers=True, verbose=False)
    loaded = load_corpus(spec.data)  # read and checked against data.sha256
    if resume is not None:
        resume.check_corpus(loaded)  # the text the run trained on, before any tokenizer is built for another
    corpus = prepare_corpus(spec.data, spec.tokenizer, spec.data_dir / "tokenizers", probe=spec.probe, seed=spec.seed,
                            loaded=loaded)
    tokenizer = corpus.tokenizer
    trained = spec.recipe is not None  # else counted: no recipe, no learning rate, no epochs
    task = LanguageModelTask(architecture=spec.architecture, vocab_size=tokenizer.vocab_size,
                             optim=spec.recipe.to_dict() if trained else None, model_name=spec.model_name,
                             tokenizer=tokenizer, lr=spec.lr, epochs=spec.epochs if trained else None)
    task.corpus_sha256 = corpus.sha256  # in every checkpoint: a resume refuses another text
    if corpus.probe is not None:
        task.weigh_recall(corpus.probe.symbol_ids.closing, spec.recall_weight)
    model = task.model
    val_ids = corpus.val_ids[:SMOKE_VAL_TOKENS] if spec.smoke else corpus.val_ids
    epoch_val_ids = val_ids[:spec.validation_tokens]  # None: the whole split
    scored_ids = corpus.scored_split(spec.evaluation.split)  # the end of run's: evaluation.split=test when asked
    val_ids = scored_ids[:SMOKE_VAL_TOKENS] if spec.smoke else scored_ids
    data = CorpusDataModule(corpus.train_ids, epoch_val_ids, spec.batch_size, spec.seq_len, spec.steps_per_epoch,
                            seed=spec.seed, eval_batch_size=spec.eval_batch_size,
                            batching=spec.batching if model.trainable else "windows",  # counted: no batches
                            probe=corpus.probe)
    val_batches = len(data.val_dataloader())
    check_sizes(spec, model, data.train_ids.numel(), val_ids.numel())
    check_trainer(spec, val_batches, model.trainable)  # what Lightning refuses, before any write
    if resume is not None:
        # a counted model is counted afresh: its tables take their shapes from the counting
        resume.check(task.hparams, tokenizer, weight_shapes(task.state_dict()) if model.trainable else None)
    run = Run(spec, resume, RunDir(spec.output_dir), corpus, task, data, Split.of(val_ids, tokenizer),
              Split.of(epoch_val_ids, tokenizer), count_parameters(model) if model.trainable else None,
              stopping=build_early_stopping(spec.early_stopping) if model.trainable else None)
    print(describe_run(run))
    return run


def describe_run(run: Run) -> str:
    spec, model, tokenizer = run.spec, run.task.model, run.corpus.tokenizer
    lines = [f"model {spec.model_name}: {model.family}, {tokenizer.kind} tokenizer, "
             f"vocabulary {tokenizer.vocab_size}, corpus {run.corpus.source}"]
    if spec.smoke:
        lines.append(f"fast_dev_run: a smoke run on a small slice (the first {run.val.n_targets + 1:,} validation "
                     "tokens, a sampled evaluation): its figures say nothing about the model")
    if run.parameters is not None:  # a counted model: its stored numbers once counted
        lines.append(f"trainable parameters: {run.parameters:,}")
    if spec.batching == "streams" and not model.trainable:
        lines.append(f"training=streams: {spec.model_name} is counted, not trained; its counts are the same either way")
    if run.resume is not None:
        lines.append(f"resuming from {run.resume.checkpoint} (step {run.resume.step})")
    return "\n".join(lines)


def fit_or_count(run: Run, current) -> Fitted:
    """The run folder, loggers, checkpoints and callbacks; then training (or counting). `current`: the job, which
    records a failure in the logger built here."""
    spec, task, resume = run.spec, run.task, run.resume
    run.folder.path.mkdir(parents=True, exist_ok=True)  # only now: input errors above leave nothing behind
    if is_first_rank():  # the job's config record, now that the folder is its own and every check has passed
        run.folder.record_config(spec.config, resumed=resume is not None)
    task.run_config = spec.config  # in every checkpoint: resume.saved_config
    checkpoints = checkpoint_callbacks(run.folder.checkpoint_dir, spec.checkpoint_every_n_steps)
    checkpoint_io = AtomicCheckpointIO()
    logger = current.logger = build_logger(
        spec.logger, spec.resolved_config, wandb_id=resume and resume.wandb_run_id,
        csv_version=None if resume is None else f"resumed_step{resume.step}")
    if logger and resume is None and run.parameters is not None:
        logger.log_metrics({"parameters": run.parameters})
    epoch_tokens = spec.steps_per_epoch * spec.tokens_per_step
    weights = in_memory(run)
    modes = ModesOverTraining(weights, run.epoch_val, epoch_tokens, spec.evaluation,
                              decoded_pieces(run.corpus.tokenizer, run.corpus.train_ids))
    callbacks = [*checkpoints, TrainingState(), MetricsHistory(run.folder.history_file, resume and resume.step),
                 modes, CostEstimate(weights, run.val, spec.evaluation, tokens_per_step=spec.tokens_per_step,
                                     epoch_tokens=epoch_tokens, eval_batch_size=spec.eval_batch_size, modes=modes,
                                     validation_targets=run.epoch_val.n_targets,
                                     train_ids=run.corpus.train_ids, probe=run.corpus.probe),
                 *([run.stopping] if run.stopping is not None else [])]
    limit = {}
    if resume is not None and resume.stopped_early is not None:  # stopped early, then cut off in its evaluation
        print(f"{run.folder.path} stopped early at step {resume.step:,} ({resume.stopped_early}): not training on; "
              "finishing its evaluation")
        limit = {"max_steps": resume.step}  # Lightning restores the checkpoint and trains nothing
    trainer = resume_epoch_ends_exactly(instantiate(spec.trainer, max_epochs=spec.epochs, logger=logger,
                                                    plugins=[checkpoint_io], callbacks=callbacks, **limit))
    # bf16 matmul inputs where low_precision_matmuls and the hardware say so (precision.py).
    precision = apply_matmul_precision(task.model, spec.low_precision_matmuls, spec.precision, trainer)
    print(f"device: {trainer.strategy.root_device}, precision: {precision['precision']}, "
          f"matmuls in {precision['matmul_dtype']}")
    if not task.model.trainable:  # counted, not trained: count the training split, validate once, save
        count_and_save(trainer, task, run.data, run.folder)
        parameters = count_parameters(task.model)
        print(f"counted {task.train_tokens:,} training tokens in {task.train_seconds:.2f} s; "
              f"stored numbers: {parameters:,}")
        if logger:
            logger.log_metrics({"parameters": parameters})
        return Fitted(trainer, checkpoints, logger, precision, parameters)
    try:
        # The one full read of a resumed checkpoint: Lightning's, through checkpoint_io, which loads
        # weights only whatever Lightning asks for.
        trainer.fit(task, datamodule=run.data, ckpt_path=resume and resume.checkpoint, weights_only=True)
    except TrainingDiverged as err:
        if isinstance(err, NonFiniteWeights):
            raise  # its message already says which checkpoint was kept
        kept = f", {checkpoint_io.kept}" if checkpoint_io.kept else " before any checkpoint was saved"
        raise TrainingDiverged(f"{err}; stopped{kept}; try a lower model.lr") from err
    keep_final_weights(trainer, run.folder, checkpoints)
    return Fitted(trainer, checkpoints, logger, precision, run.parameters)


def summarize(run: Run, fitted: Fitted) -> dict:
    """The run's record (summary.json's first part: train adds the figures and the wall time); its validation
    figures (over the first data.validation_tokens) the last validation's if it scored the final weights on every
    one of those targets, else one more pass's."""
    spec, task, trainer = run.spec, run.task, fitted.trainer
    model = task.model
    task.to(trainer.strategy.root_device)
    val = task.last_val_score
    if not (task.last_val_step == trainer.global_step and val is not None and val.tokens == run.epoch_val.n_targets):
        val = score_chunks(model, run.epoch_val.to(task.device), spec.seq_len, spec.eval_batch_size)
    checkpoint, *_ = fitted.checkpoints
    return {
        "status": "completed",
        "smoke": spec.smoke,  # trainer.fast_dev_run: figures of a small slice
        "model": spec.model_name,
        "family": model.family,
        "tokenizer": run.corpus.tokenizer.kind,
        "vocab_size": run.corpus.tokenizer.vocab_size,
        "parameters": fitted.parameters,
        "context": model.context,  # tokens the model can see; None: unbounded
        "recurrent": model.recurrent,  # it carries a state from step to step (the protocol's)
        "training_mode": spec.batching if model.trainable else "counted",  # windows | streams (truncated BPTT)
        "seq_len": spec.seq_len,  # the training window
        "probe": "recall" if run.corpus.probe is not None else None,  # probe=recall: pairs planted in training
        "train_loss": task.last_epoch_train_loss if model.trainable else None,  # counted: no training loss
        "val_loss": val.nll,
        "val_bpc": val.bpc,
        "tokens_per_second": task.tokens_per_second,  # per process: times world_size under DDP
        "train_seconds": task.train_seconds,  # the training steps (or the counting) alone
        "train_steps": trainer.global_step,
        # What evaluation.budget is a multiple of: the tokens trained (a counted model: counted).
        "train_tokens": trainer.global_step * spec.tokens_per_step if model.trainable else task.train_tokens,
        "world_size": trainer.world_size,
        "device": str(trainer.strategy.root_device),
        **fitted.precision,
        "cuda_graphs": task.graphed_step is not None and task.graphed_step.captured,  # the step replayed
        "checkpoint": (next((c.last_model_path for c in fitted.checkpoints if c.last_model_path), None)
                       if model.trainable else str(run.folder.checkpoint)),  # counted: saved by count_and_save
        "best_checkpoint": checkpoint.best_model_path or None,
        "run_dir": str(run.folder.path),
        "corpus": str(run.corpus.source),  # what it trained on (data.path, or the bundled corpus's name)
        "corpus_sha256": run.corpus.sha256,  # of that file's text (a resume checks it)
        "evaluated_split": spec.evaluation.split,  # the end-of-run figures': validation, or test when asked
        "resumed_from_step": run.resume and run.resume.step,
        # early_stopping, stopped_early, stopped_at_step, stop_reason, early_stopping_best_step (runs/stopping.py)
        **stopping_summary(spec.early_stopping, run.stopping),
    }


def write(folder: RunDir, logger, summary: dict, samples: dict) -> None:
    """summary.json and samples.json (and W&B's summary), and the lines that end the run."""
    folder.write_summary(summary)
    write_json(folder.samples_file, samples)
    if is_wandb(logger):
        logger.experiment.summary.update({k: v for k, v in summary.items() if v is not None})
    train_loss = "—" if summary["train_loss"] is None else f"{summary['train_loss']:.4f}"  # None: a counted model
    if summary["stopped_early"]:
        print(f"stopped early at step {summary['stopped_at_step']:,}: {summary['stop_reason']}")
    steps = f"{summary['train_steps']:,} steps at " if summary["train_loss"] is not None else ""  # counted: none
    print(f"{summary['model']}: train loss {train_loss} | val loss {summary['val_loss']:.4f} "
          f"| val bpc {summary['val_bpc']:.4f} | {steps}{summary['tokens_per_second']:,.0f} tokens/s "
          f"| {summary['wall_seconds']:.1f} s | summary: {summary['run_dir']}/summary.json")


def checkpoint_callbacks(dirpath: Path, every_n_steps: int) -> tuple[ModelCheckpoint, ...]:
    """The best checkpoint by val/loss and last.ckpt, at every epoch end and every `every_n_steps` steps (so that
    a kill loses little); both write the same last.ckpt (no -v1 copies)."""
    best = RunCheckpoint(dirpath=dirpath, filename="best-epoch{epoch}-step{step}", auto_insert_metric_name=False,
                           monitor="val/loss", mode="min", save_top_k=1, save_last=True,
                           enable_version_counter=False)
    if not every_n_steps:
        return (best,)
    periodic = StepCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True, every_n_train_steps=every_n_steps,
                              enable_version_counter=False)
    return best, periodic


def keep_final_weights(trainer, run: RunDir, callbacks) -> None:
    """last.ckpt also at the final step when trainer.max_steps stopped training between two checkpoints, so that
    it holds the weights the summary scores (every rank decides alike: saving is collective)."""
    saved = max((getattr(c, "_last_global_step_saved", -1) for c in callbacks), default=-1)
    if trainer.fast_dev_run or saved == trainer.global_step or trainer.global_step == 0:
        return
    trainer.save_checkpoint(run.checkpoint, weights_only=False)  # the whole training state; read weights-only


def count_and_save(trainer, task: LanguageModelTask, datamodule: CorpusDataModule, run: RunDir) -> None:
    """A counted model's "training": count the training split (timed), validate once and save last.ckpt through
    the trainer (as any other checkpoint)."""
    started = time.perf_counter()
    task.model.fit(datamodule.train_ids)
    task.train_seconds = time.perf_counter() - started
    task.train_tokens = datamodule.train_ids.numel()
    trainer.validate(task, datamodule=datamodule, verbose=False)
    # A checkpoint like a trained model's (Lightning's weights_only=True would leave out the state a resume reads);
    # every load reads it weights-only (checkpoints.read_checkpoint).
    trainer.save_checkpoint(run.checkpoint, weights_only=False)
