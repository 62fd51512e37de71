"""The training job's score step: the final weights and the best checkpoint evaluated by their plans, and the
seeded samples side by side; printed and logged (docs/evaluation.md). The inference modes over training: after every
validation, val/stateful_bpc, val/stateless_bpc and the word validity of a stateful and a stateless sample, as one
OVER_TRAINING evaluation within an epoch's budget (ModesOverTraining). And the cost of those plans: after its first
training steps a run prints its estimated time, the steps left at the measured rate, plus the forward tokens of the
plans it will run at that rate times EVAL_FORWARD_SPEEDUP (docs/sweeps.md)."""

import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig

from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.loggers import is_wandb
from gru_experiments.runs.recipe import recipe_length
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.evaluation import Evaluation, EvaluationSettings, curve_points, evaluate, plan_for
from gru_experiments.study.generation import (
    MODES,
    NO_PROGRESS,
    STUDY_PROMPTS,
    Decoding,
    Progress,
    side_by_side_samples,
    spellable_prompts,
    tokens_for_chars,
)
from gru_experiments.study.plan import BEST, FINAL, OVER_TRAINING, STATEFUL, STATELESS, TEXT, Request
from gru_experiments.study.scores import Split, score_chunks
from gru_experiments.study.text_index import TrainingIndex, words


def run_request(cfg: DictConfig, model, val: Split, training_tokens, settings: EvaluationSettings,
                purpose: str = FINAL, *, tokenizer=None, train_ids=None, probe=None, load_text_index=None) -> Request:
    """The evaluation Request of a run (study/plan.py): its settings, its seed and its training split's index
    for the text statistics (counted once per corpus: TrainingIndex.cached)."""
    def index():
        return TrainingIndex.cached(tokenizer.decode(train_ids.tolist()), Path(cfg.paths.data_dir))
    return Request(model, val, settings, training_tokens, purpose,
                   tokenizer, train_ids, probe, int(cfg.get("seed", 0)), load_text_index or index)


class ModesOverTraining(Callback):
    """`epoch_tokens`: what evaluation.budget is a multiple of here. The word validity needs a `tokenizer` and
    the training split's text."""

    def __init__(self, cfg, val: Split, epoch_tokens: int, settings: EvaluationSettings, tokenizer=None,
                 train_text: str | None = None):
        self.cfg, self.val, self.epoch_tokens, self.settings = cfg, val, epoch_tokens, settings
        self.tokenizer = tokenizer if train_text is not None else None
        # what the word validity reads of a training index: its words (counted here without the rest)
        self.index = SimpleNamespace(vocabulary=frozenset(words(train_text))) if self.tokenizer is not None else None
        self.last: dict | None = None  # the latest validation's summary

    def request(self, model):
        return run_request(self.cfg, model, self.val, self.epoch_tokens, self.settings, OVER_TRAINING,
                           tokenizer=self.tokenizer, load_text_index=lambda: self.index)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self.last = evaluate(self.request(pl_module.model)).summary()
        for mode in (STATEFUL, STATELESS):
            pl_module.log(f"val/{mode}_bpc", self.last[f"{mode}_bpc"])
            if self.last.get(f"{mode}_word_validity") is not None:
                pl_module.log(f"val/{mode}_word_validity", self.last[f"{mode}_word_validity"])


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
    modes, *others = evaluation.descriptions()
    print(f"evaluation of the final weights (step {summary['train_steps']}, {summary['eval_seconds']:.1f} s): "
          f"{modes}\n{format_best(summary['best'])}" + "".join(f"\n{other}" for other in others))
    for prompt, stateful, stateless in zip(samples["prompts"], samples["stateful"], samples["stateless"]):
        print(f"--- {prompt!r} stateful:\n{stateful}\n--- {prompt!r} stateless:\n{stateless}")
    if logger:
        log_evaluation(logger, evaluation, summary, samples)
    return samples


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
            import wandb

            rows = [[int(key), value] for key, value in curve_points(modes.curve) if key.isdigit()]
            table = wandb.Table(columns=["context_tokens", "bpc"], data=rows)
            title = (f"{summary['model']}: bits per character against context "
                     f"(stateful: {modes.curve['stateful']:.4f})")
            logger.experiment.log({"context_curve/table": table,
                                   "context_curve/plot": wandb.plot.line(table, "context_tokens", "bpc", title=title)})
        logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                         data=[list(row) for row in zip(samples["prompts"], samples["stateful"], samples["stateless"])])
    logger.save()


# Forward tokens/s of the evaluation (windows in big batches) over the training tokens/s (forward,
# backward, AdamW), measured side by side (benchmarks/RESULTS.md). The lowest, so that the estimate errs long.
EVAL_FORWARD_SPEEDUP = 1.5


def format_estimate(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class CostEstimate(Callback):
    """Prints the estimate once `min_steps` steps after the first (a warm-up) are timed, or `min_seconds`."""

    def __init__(self, val: Split, cfg, settings: EvaluationSettings, *, model, tokenizer=None, modes=None,
                 train_ids=None, probe=None, min_steps: int = 10, min_seconds: float = 20.0):
        self.val, self.cfg, self.settings, self.tokenizer, self.modes = val, cfg, settings, tokenizer, modes
        self.train_ids, self.probe = train_ids, probe
        self.model, self.min_steps, self.min_seconds = model, min_steps, min_seconds
        self._first_step: int | None = None
        self._started = 0.0
        self.estimate: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.estimate is not None or trainer.fast_dev_run:
            return
        if self._first_step is None:  # the first step warms up: timing starts after it
            self._first_step, self._started = trainer.global_step, time.perf_counter()
            return
        steps, seconds = trainer.global_step - self._first_step, time.perf_counter() - self._started
        if steps >= self.min_steps or (steps >= 1 and seconds >= self.min_seconds):
            self.estimate = self.compute(trainer, seconds / steps)
            if trainer.is_global_zero:
                print(self.describe(self.estimate), flush=True)

    def compute(self, trainer, step_seconds: float) -> dict:
        total_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
            trainer.estimated_stepping_batches
        steps_left = max(int(total_steps) - trainer.global_step, 0)
        tokens_per_step = self.cfg.data.batch_size * self.cfg.data.seq_len
        forward_seconds = step_seconds / tokens_per_step / EVAL_FORWARD_SPEEDUP  # per forward token
        epochs = max(int(trainer.max_epochs or 1) - trainer.current_epoch, 1)
        per_epoch = getattr(trainer, "num_training_batches", None)
        if isinstance(per_epoch, int) and per_epoch > 0:  # max_steps may end training before the epochs do
            epochs = max(min(epochs, math.ceil(int(total_steps) / per_epoch) - trainer.current_epoch), 1)
        evaluation = self.evaluation_forward_tokens(self.model, int(total_steps) * tokens_per_step)
        epoch_tokens = recipe_length(self.cfg)[1] * tokens_per_step
        modes = plan_for(self.modes.request(self.model) if self.modes is not None else
                         run_request(self.cfg, self.model, self.val, epoch_tokens, self.settings, OVER_TRAINING))
        validation = self.val.n_targets + modes.forward_tokens  # the chunked pass (val_loss), then the modes
        estimate = {"step_seconds": step_seconds, "steps_left": steps_left,
                    "train_seconds": steps_left * step_seconds,
                    "validation_seconds": epochs * validation * forward_seconds,
                    "eval_forward_tokens": evaluation, "eval_seconds": evaluation * forward_seconds}
        estimate["total_seconds"] = (estimate["train_seconds"] + estimate["validation_seconds"]
                                     + estimate["eval_seconds"])
        return estimate

    def evaluation_forward_tokens(self, model, training_tokens: int) -> int:
        """The final weights' plan and the best checkpoint's (counted as if it were not the final one)."""
        final = run_request(self.cfg, model, self.val, training_tokens, self.settings, tokenizer=self.tokenizer,
                            train_ids=self.train_ids, probe=self.probe)
        return plan_for(final).forward_tokens + plan_for(replace(final, purpose=BEST)).forward_tokens

    @staticmethod
    def describe(e: dict) -> str:
        return (f"estimated time left: {format_estimate(e['total_seconds'])} = training "
                f"{format_estimate(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
                f"+ validation {format_estimate(e['validation_seconds'])} + end-of-run evaluation "
                f"{format_estimate(e['eval_seconds'])} ({e['eval_forward_tokens'] / 1e6:.1f}M forward tokens; "
                "evaluation.budget bounds it)")
