"""The training job's score step: the final weights evaluated by their plan (study/plan.py, within
evaluation.budget of the run's training tokens), the best checkpoint likewise without the curve, and
the seeded samples side by side; printed, and handed to the loggers (docs/evaluation.md)."""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig

from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.loggers import is_wandb
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.context_curve import curve_points
from gru_experiments.study.evaluation import Evaluation, evaluate, plan_for
from gru_experiments.study.inference import (
    MODES,
    STUDY_PROMPTS,
    Decoding,
    side_by_side_samples,
    spellable_prompts,
    tokens_for_chars,
)
from gru_experiments.study.progress import NO_PROGRESS, Progress
from gru_experiments.study.recall import format_recall, score_recall
from gru_experiments.study.scores import Split, score_chunks
from gru_experiments.study.target_classes import TargetClasses, split_classes
from gru_experiments.study.text_index import TrainingIndex
from gru_experiments.study.text_protocol import (
    TextSettings,
    fitting,
    format_text_statistics,
    measure_text,
    settings_for,
    text_demand,
    text_settings,
)


def score_run(cfg: DictConfig, model, train_ids, val: Split, summary: dict, logger, tokenizer, probe=None) -> dict:
    """Adds every figure of the final weights and of the best checkpoint to `summary` (with
    `eval_seconds`), logs them, and returns the samples (with the texts the text statistics measured).
    A bar per pass (trainer.enable_progress_bar)."""
    started = time.perf_counter()
    progress = Progress(enabled=bool(cfg.trainer.get("enable_progress_bar", True)))
    text = run_text_settings(cfg, val)
    plan = plan_for(model, val.n_targets, cfg.data.seq_len, cfg.evaluation, summary["train_tokens"],
                    text=text_demand(model, tokenizer, val, text))
    if plan.budget is None:  # no budget bounds it: say what it asks for before it starts
        print(f"evaluation: every figure exact (evaluation.budget=null), {plan.forward_tokens:,} forward tokens "
              f"({plan.forward_tokens / max(summary['train_tokens'], 1):,.1f} per token trained), a bar per pass")
    evaluation = evaluate(model, train_ids, val, plan, progress=progress, classes=classes_of(val, tokenizer, plan))
    summary |= evaluation.metrics() | {"mode_evaluation": evaluation.settings, "context_curve": evaluation.curve,
                                       "eval_whole_split": plan.exact}
    measured = plan.text and measure_run_text(cfg, model, tokenizer, train_ids, val, settings_for(text, plan.text),
                                              Progress(progress.enabled, "text statistics"))
    if probe is not None:  # the planted-recall control (data/recall_probe.py)
        summary["recall"] = score_recall(model, probe.validation, seq_len=cfg.data.seq_len, window=plan.window,
                                         keys=probe.settings.keys, progress=progress)
    summary["best"] = score_best(cfg, summary, train_ids, val, model.device,
                                 Progress(progress.enabled, "evaluation, best checkpoint"))
    prompts = spellable_prompts(tokenizer, STUDY_PROMPTS, val.ids)
    samples = side_by_side_samples(model, tokenizer, prompts, max_new_tokens=tokens_for_chars(
        cfg.evaluation.sample_chars, val), decoding=Decoding(temperature=cfg.evaluation.sample_temperature),
        seed=cfg.seed)
    if measured:
        summary["text"] = {key: value for key, value in measured.items() if key != "texts"}
        samples["text"] = measured["texts"]
    summary["eval_seconds"] = time.perf_counter() - started
    print(describe(evaluation, summary))
    if measured:
        print(format_text_statistics(measured))
    if probe is not None:
        print(format_recall(summary["recall"]))
    for prompt, stateful, stateless in zip(samples["prompts"], samples["stateful"], samples["stateless"]):
        print(f"--- {prompt!r} stateful:\n{stateful}\n--- {prompt!r} stateless:\n{stateless}")
    if logger:
        log_evaluation(logger, evaluation, summary, samples)
    return samples


def classes_of(val: Split, tokenizer, plan) -> TargetClasses:
    """The kinds of target of the validation split, for the curve by class (study/target_classes.py)."""
    longest = max((f.context for f in plan.figures if f.name.startswith("curve ")), default=None)
    return split_classes(val.ids.cpu(), tokenizer, plan.window, longest)


def run_text_settings(cfg: DictConfig, val: Split) -> TextSettings | None:
    """The text statistics a run's evaluation asks for and its validation split affords (None:
    evaluation.text_samples is 0, or the split is shorter than a sample: it says so)."""
    asked = text_settings(cfg.evaluation, cfg.data.seq_len, cfg.seed)
    settings = fitting(asked, val.characters)
    if asked is not None and settings is None:
        print(f"text statistics left out: the validation split has {val.characters:,} characters, fewer than "
              f"a sample's evaluation.text_chars={asked.chars}")
    return settings


def measure_run_text(cfg: DictConfig, model, tokenizer, train_ids, val: Split, settings: TextSettings,
                     progress) -> dict:
    """The text statistics of the final weights (study/text_protocol.py), as the plan cut them, with
    their seconds; the training split's index counted once per corpus (TrainingIndex.cached)."""
    started = time.perf_counter()
    index = TrainingIndex.cached(tokenizer.decode(train_ids.tolist()), Path(cfg.paths.data_dir))
    measured = measure_text(model, tokenizer, index, tokenizer.decode(val.ids.tolist()), settings,
                            val_ids=val.ids, progress=progress)
    return measured | {"seconds": time.perf_counter() - started}


def describe(evaluation: Evaluation, summary: dict) -> str:
    """The final weights' evaluation for the log, with the best checkpoint's."""
    return (f"evaluation of the final weights (step {summary['train_steps']}, {summary['eval_seconds']:.1f} s): "
            f"{evaluation.describe()}\n{format_best(summary['best'])}")


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
    plan = plan_for(model, val.n_targets, cfg.data.seq_len, cfg.evaluation, summary["train_tokens"], curve=False)
    metrics = evaluate(model, train_ids, val, plan, progress=progress).metrics()
    return best | {"val_loss": chunks.nll, "val_bpc": chunks.bpc} | {key: metrics[key] for key in keys[2:]}


def format_best(best: dict) -> str:
    if best["same_as_final"]:
        return f"best checkpoint by val/loss: the final weights (step {best['step']})"
    figures = ", ".join(f"{key.removesuffix('_bpc')} {best[key]:.4f}" for key in
                        ("val_bpc", *(f"{mode}_bpc" for mode in MODES)))
    return f"best checkpoint by val/loss (step {best['step']}), bits per character: {figures}"


def log_evaluation(logger, evaluation: Evaluation, summary: dict, samples: dict) -> None:
    """The figures, the curve and the best checkpoint's figures to the loggers (W&B: a plot and tables)."""
    step = summary["train_steps"]
    logger.log_metrics({f"modes/{k}": v for k, v in evaluation.metrics().items()}, step=step)
    logger.log_metrics({f"context_curve/{k}": v for k, v in curve_points(evaluation.curve)}, step=step)
    logger.log_metrics({f"best/{k}": v for k, v in summary["best"].items() if isinstance(v, (int, float))
                        and not isinstance(v, bool)}, step=step)
    text = summary.get("text") or {"modes": {}}
    logger.log_metrics({f"text/{mode}/{decoder}/{name}": figure["value"] for mode, by_decoder in text["modes"].items()
                        for decoder, figures in by_decoder.items() for name, figure in figures.items()
                        if figure["value"] is not None}, step=step)
    if is_wandb(logger):
        if evaluation.curve:
            log_curve_to_wandb(logger, evaluation.curve, summary["model"])
        logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                         data=[list(row) for row in zip(samples["prompts"], samples["stateful"], samples["stateless"])])
    logger.save()


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
