"""The training job's score step: the final weights and the best checkpoint evaluated by their plans, and the
seeded samples side by side; printed and logged (docs/evaluation.md)."""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig

from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.loggers import is_wandb
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.context_curve import curve_points
from gru_experiments.study.evaluation import Evaluation, evaluate, plan_for
from gru_experiments.study.generation import (
    MODES,
    STUDY_PROMPTS,
    Decoding,
    side_by_side_samples,
    spellable_prompts,
    tokens_for_chars,
)
from gru_experiments.study.plan import BEST, FINAL, TEXT, Request
from gru_experiments.study.progress import NO_PROGRESS, Progress
from gru_experiments.study.scores import Split, score_chunks
from gru_experiments.study.settings import EvaluationSettings
from gru_experiments.study.text_index import TrainingIndex


def run_request(cfg: DictConfig, model, val: Split, training_tokens, settings: EvaluationSettings,
                purpose: str = FINAL, *, tokenizer=None, train_ids=None, probe=None, load_text_index=None) -> Request:
    """The evaluation Request of a run (study/plan.py): its settings, its seed and its training split's index
    for the text statistics (counted once per corpus: TrainingIndex.cached)."""
    def index():
        return TrainingIndex.cached(tokenizer.decode(train_ids.tolist()), Path(cfg.paths.data_dir))
    return Request(model, val, settings, training_tokens, purpose,
                   tokenizer, train_ids, probe, int(cfg.get("seed", 0)), load_text_index or index)


def score_run(cfg: DictConfig, model, train_ids, val: Split, summary: dict, logger, tokenizer, probe,
              settings: EvaluationSettings) -> dict:
    """Adds the final weights' and the best checkpoint's figures to `summary`, logs them; the samples."""
    started = time.perf_counter()
    progress = Progress(enabled=bool(cfg.trainer.get("enable_progress_bar", True)))
    request = run_request(cfg, model, val, summary["train_tokens"], settings, tokenizer=tokenizer,
                          train_ids=train_ids, probe=probe)
    plan = plan_for(request)
    if plan.budget is None:  # no budget bounds it: say what it asks for before it starts
        print(f"evaluation: every figure exact (evaluation.budget=null), {plan.forward_tokens:,} forward tokens "
              f"({plan.forward_tokens / max(summary['train_tokens'], 1):,.1f} per token trained), a bar per pass")
    evaluation = evaluate(request, plan, progress)
    summary |= evaluation.summary()
    summary["best"] = score_best(cfg, summary, train_ids, val, model.device, settings,
                                 Progress(progress.enabled, "evaluation, best checkpoint"))
    prompts = spellable_prompts(tokenizer, STUDY_PROMPTS, val.ids)
    chars, temperature = settings.samples.chars, settings.samples.temperature
    samples = side_by_side_samples(model, tokenizer, prompts, max_new_tokens=tokens_for_chars(chars, val),
                                   decoding=Decoding(temperature=temperature), seed=cfg.seed)
    if evaluation.results.get(TEXT):
        samples["text"] = evaluation.results[TEXT]["texts"]
    summary["eval_seconds"] = time.perf_counter() - started
    print(describe(evaluation, summary))
    for prompt, stateful, stateless in zip(samples["prompts"], samples["stateful"], samples["stateless"]):
        print(f"--- {prompt!r} stateful:\n{stateful}\n--- {prompt!r} stateless:\n{stateless}")
    if logger:
        log_evaluation(logger, evaluation, summary, samples)
    return samples


def describe(evaluation: Evaluation, summary: dict) -> str:
    modes, *others = evaluation.descriptions()
    return (f"evaluation of the final weights (step {summary['train_steps']}, {summary['eval_seconds']:.1f} s): "
            f"{modes}\n{format_best(summary['best'])}" + "".join(f"\n{other}" for other in others))


def score_best(cfg: DictConfig, summary: dict, train_ids, val: Split, device, settings: EvaluationSettings,
               progress=NO_PROGRESS) -> dict:
    """The best checkpoint (lowest val/loss) scored in every mode; the final weights' figures when it holds them
    (or there is none: a counted model)."""
    final_step = summary["train_steps"]
    path = summary.get("best_checkpoint")
    keys = ["val_loss", "val_bpc", *(f"{mode}_{unit}" for mode in MODES for unit in ("nll", "bpc"))]
    if path and not Path(path).is_file():  # a run folder copied (or resumed) without it: the rest still counts
        return {"step": None, "checkpoint": path, "same_as_final": False, "missing": True} | dict.fromkeys(keys)
    step = read_checkpoint(path, mmap=True).get("global_step") if path else final_step
    best = {"step": step, "checkpoint": path or summary.get("checkpoint"), "same_as_final": step == final_step}
    if step == final_step:
        return best | {key: summary.get(key) for key in keys}
    model = load_checkpoint(path, map_location=device).model.to(device)
    val = val.to(device)
    chunks = score_chunks(model, val, cfg.data.seq_len, cfg.data.eval_batch_size)
    metrics = evaluate(run_request(cfg, model, val, summary["train_tokens"], settings, BEST, train_ids=train_ids),
                       progress=progress).summary()
    return best | {"val_loss": chunks.nll, "val_bpc": chunks.bpc} | {key: metrics[key] for key in keys[2:]}


def format_best(best: dict) -> str:
    if best.get("missing"):
        return f"best checkpoint by val/loss: {best['checkpoint']} is missing, so its figures are left out"
    if best["same_as_final"]:
        return f"best checkpoint by val/loss: the final weights (step {best['step']})"
    figures = ", ".join(f"{key.removesuffix('_bpc')} {best[key]:.4f}" for key in
                        ("val_bpc", *(f"{mode}_bpc" for mode in MODES)))
    return f"best checkpoint by val/loss (step {best['step']}), bits per character: {figures}"


def log_evaluation(logger, evaluation: Evaluation, summary: dict, samples: dict) -> None:
    step, modes = summary["train_steps"], evaluation.modes
    logger.log_metrics({f"modes/{k}": v for k, v in modes.metrics().items()}, step=step)
    logger.log_metrics({f"context_curve/{k}": v for k, v in curve_points(modes.curve)}, step=step)
    logger.log_metrics({f"best/{k}": v for k, v in summary["best"].items() if isinstance(v, (int, float))
                        and not isinstance(v, bool)}, step=step)
    text = summary.get("text") or {"modes": {}}
    logger.log_metrics({f"text/{mode}/{decoder}/{name}": figure["value"] for mode, by_decoder in text["modes"].items()
                        for decoder, figures in by_decoder.items() for name, figure in figures.items()
                        if figure["value"] is not None}, step=step)
    if is_wandb(logger):
        if modes.curve:
            log_curve_to_wandb(logger, modes.curve, summary["model"])
        logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                         data=[list(row) for row in zip(samples["prompts"], samples["stateful"], samples["stateless"])])
    logger.save()


def log_curve_to_wandb(logger, curve: dict, model_name: str) -> None:
    import wandb

    rows = [[int(key), value] for key, value in curve_points(curve) if key.isdigit()]
    table = wandb.Table(columns=["context_tokens", "bpc"], data=rows)
    logger.experiment.log({
        "context_curve/table": table,
        "context_curve/plot": wandb.plot.line(table, "context_tokens", "bpc",
                                              title=f"{model_name}: bits per character against context "
                                                    f"(stateful: {curve['stateful']:.4f})"),
    })
