"""The training job's score step: the final weights and the best checkpoint through the evaluation door
(runs/trained_run.py), and the seeded samples side by side; printed and logged (docs/evaluation.md)."""

import time
from pathlib import Path

from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.loggers import figure_metrics, is_wandb
from gru_experiments.runs.trained_run import TrainedRun, evaluate, load, plan
from gru_experiments.study.cost import describe_plan
from gru_experiments.study.evaluation import Evaluation, EvaluationSettings, curve_points
from gru_experiments.study.generation import (
    NO_PROGRESS,
    STUDY_PROMPTS,
    Decoding,
    Progress,
    side_by_side_samples,
    spellable_prompts,
    tokens_for_chars,
)
from gru_experiments.study.modes import MODES, STATEFUL, STATELESS
from gru_experiments.study.plan import BEST, TEXT
from gru_experiments.study.scores import Split, score_chunks


def score_run(run: TrainedRun, val: Split, record: dict, logger, settings: EvaluationSettings, *, train_ids,
              probe, eval_batch_size: int, progress_bars: bool = True) -> tuple[dict, dict]:
    """The final weights' and the best checkpoint's figures and the samples; printed and logged."""
    started = time.perf_counter()
    progress = Progress(enabled=progress_bars, lines=not progress_bars)  # without bars, a line per pass
    tokens = record["train_tokens"]
    final = plan(run, settings, val, training_tokens=tokens, train_ids=train_ids, probe=probe)
    print(describe_plan(final, tokens, settings), flush=True)
    evaluation = evaluate(run, settings, val, training_tokens=tokens, train_ids=train_ids, probe=probe, plan=final,
                          progress=progress)
    figures = evaluation.summary()
    figures["best"] = score_best(run, record | figures, val, settings, train_ids=train_ids,
                                 eval_batch_size=eval_batch_size,
                                 progress=Progress(progress.enabled, "evaluation, best checkpoint", progress.lines))
    prompts = spellable_prompts(run.tokenizer, STUDY_PROMPTS, val.ids)
    chars, temperature = settings.samples.chars, settings.samples.temperature
    samples = side_by_side_samples(run.model, run.tokenizer, prompts, max_new_tokens=tokens_for_chars(chars, val),
                                   decoding=Decoding(temperature=temperature), seed=run.seed)
    if evaluation.results.get(TEXT):
        samples["text"] = evaluation.results[TEXT]["texts"]
    figures["eval_seconds"] = time.perf_counter() - started
    modes, *others = evaluation.descriptions()
    print(f"evaluation of the final weights (step {record['train_steps']}, {figures['eval_seconds']:.1f} s): "
          f"{modes}\n{format_best(figures['best'])}" + "".join(f"\n{other}" for other in others))
    for prompt, stateful, stateless in zip(samples["prompts"], samples[STATEFUL], samples[STATELESS]):
        print(f"--- {prompt!r} stateful:\n{stateful}\n--- {prompt!r} stateless:\n{stateless}")
    if logger:
        log_evaluation(logger, evaluation, record | figures, samples)
    return figures, samples


def score_best(run: TrainedRun, summary: dict, val: Split, settings: EvaluationSettings, *, train_ids=None,
               eval_batch_size: int = 64, progress=NO_PROGRESS) -> dict:
    """The best checkpoint (lowest val/loss) scored in every mode; the final weights' figures when it holds them."""
    final_step = summary["train_steps"]
    path = summary.get("best_checkpoint")
    keys = ["val_loss", "val_bpc", *(f"{mode}_{unit}" for mode in MODES for unit in ("nll", "bpc"))]
    if path and not Path(path).is_file():  # a run folder copied (or resumed) without it: the rest still counts
        return {"step": None, "checkpoint": path, "same_as_final": False, "missing": True} | dict.fromkeys(keys)
    step = read_checkpoint(path, mmap=True).get("global_step") if path else final_step
    best = {"step": step, "checkpoint": path or summary.get("checkpoint"), "same_as_final": step == final_step}
    if step == final_step:
        return best | {key: summary.get(key) for key in keys}
    weights = load(Path(path), run.device, folder=run.folder, seed=run.seed, own_run=True)
    val = val.to(run.device)
    chunks = score_chunks(weights.model, val, settings.seq_len, eval_batch_size)
    metrics = evaluate(weights, settings, val, training_tokens=summary["train_tokens"], purpose=BEST,
                       train_ids=train_ids, progress=progress).summary()
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
    """Every figure of the evaluation as a metric: the modes' under modes/, the text statistics' under
    text/<mode>/<decoder>/, the best checkpoint's under best/, every other under its path (loggers.figure_metrics)."""
    step, modes = summary["train_steps"], evaluation.modes
    logger.log_metrics({f"modes/{k}": v for k, v in modes.metrics().items()}, step=step)
    logger.log_metrics(figure_metrics(evaluation.summary(), skip={*modes.metrics(), "text/modes"}), step=step)
    logger.log_metrics({f"best/{k}": v for k, v in summary["best"].items() if isinstance(v, (int, float))
                        and not isinstance(v, bool)}, step=step)
    text = summary.get("text") or {"modes": {}}
    logger.log_metrics({f"text/{mode}/{decoder}/{name}": figure["value"] for mode, by_decoder in text["modes"].items()
                        for decoder, figures in by_decoder.items() for name, figure in figures.items()
                        if figure["value"] is not None}, step=step)
    if is_wandb(logger):
        if modes.curve:
            import wandb

            rows = [[int(key), value] for key, value in curve_points(modes.curve) if key.isdigit()]
            table = wandb.Table(columns=["context_tokens", "bpc"], data=rows)
            title = (f"{summary['model']}: bits per character against context "
                     f"(stateful: {modes.curve[STATEFUL]:.4f})")
            logger.experiment.log({"context_curve/table": table,
                                   "context_curve/plot": wandb.plot.line(table, "context_tokens", "bpc", title=title)})
        logger.log_table("samples/stateful_vs_stateless", columns=["prompt", STATEFUL, STATELESS],
                         data=[list(row) for row in zip(samples["prompts"], samples[STATEFUL], samples[STATELESS])])
    logger.save()
