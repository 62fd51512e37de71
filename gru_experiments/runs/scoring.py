"""The training job's score step: the final weights and the best checkpoint evaluated by their plans, and the
seeded samples side by side; printed and logged (docs/evaluation.md). The inference modes over training: after every
validation, val/stateful_bpc, val/stateless_bpc and the word validity of a stateful and a stateless sample, as one
OVER_TRAINING evaluation within an epoch's budget (ModesOverTraining). And the cost of those plans: after its first
training steps a run prints its estimated time, the steps left at the measured rate, plus the seconds of the plans
it will run: each pass's forward tokens at the rate of its shape, measured on this machine (EvaluationClock;
docs/sweeps.md)."""

import math
import time
import weakref
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig

from gru_experiments.models.protocol import WINDOW_BATCH_TOKENS
from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.loggers import figure_metrics, is_wandb
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
from gru_experiments.study.plan import (
    BEST,
    CURVE,
    FINAL,
    MODE,
    OVER_TRAINING,
    STATEFUL,
    STATELESS,
    TEXT,
    WINDOWED,
    Request,
)
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

    def request(self, model):
        return run_request(self.cfg, model, self.val, self.epoch_tokens, self.settings, OVER_TRAINING,
                           tokenizer=self.tokenizer, load_text_index=lambda: self.index)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        figures = evaluate(self.request(pl_module.model)).summary()
        for mode in (STATEFUL, STATELESS):
            pl_module.log(f"val/{mode}_bpc", figures[f"{mode}_bpc"])
            if figures.get(f"{mode}_word_validity") is not None:
                pl_module.log(f"val/{mode}_word_validity", figures[f"{mode}_word_validity"])


def score_run(cfg: DictConfig, model, train_ids, val: Split, summary: dict, logger, tokenizer, probe,
              settings: EvaluationSettings) -> dict:
    """Adds the final weights' and the best checkpoint's figures to `summary`, logs them; the samples."""
    started = time.perf_counter()
    bars = bool(cfg.trainer.get("enable_progress_bar", True))
    progress = Progress(enabled=bars, lines=not bars)  # without bars, a line per pass
    request = run_request(cfg, model, val, summary["train_tokens"], settings, tokenizer=tokenizer,
                          train_ids=train_ids, probe=probe)
    plan = plan_for(request)
    print(describe_plan(plan, summary["train_tokens"], settings), flush=True)
    evaluation = evaluate(request, plan, progress)
    summary |= evaluation.summary()
    summary["best"] = score_best(cfg, summary, train_ids, val, model.device, settings,
                                 Progress(progress.enabled, "evaluation, best checkpoint", progress.lines))
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


def describe_plan(plan, train_tokens: int, settings: EvaluationSettings) -> str:
    """One line before the evaluation runs: its forward tokens by entry and, within a budget, what it samples or
    leaves out, and the key that scores everything."""
    by_owner = {}
    for p, owner in zip(plan.passes, plan.owners):
        by_owner[owner] = by_owner.get(owner, 0) + p.forward_tokens
    parts = ", ".join(f"{owner} {tokens:,}" for owner, tokens in by_owner.items() if tokens)
    line = (f"evaluation: {plan.forward_tokens:,} forward tokens ({parts}; "
            f"{plan.forward_tokens / max(train_tokens, 1):,.2f} per token trained), ")
    if plan.budget is None:
        return line + "every figure exact (evaluation.budget=null)"
    sampled = [f for f in plan.figures if f.kind in (MODE, CURVE) and f.targets < plan.split_targets]
    names = [f.name for f in sampled if f.kind == MODE] + (["the context curve"] if any(
        f.kind == CURVE for f in sampled) else [])
    listed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + (names[-1] if names else "")
    left = [f"{listed} sampled, with their standard errors"] if names else []
    text = next((p for p, owner in zip(plan.passes, plan.owners) if owner == TEXT), None)
    asked = settings.text
    if text is None and asked.samples and plan.figure(STATEFUL) is not None:
        left.append("no text statistics")
    elif text is not None and (text.targets < asked.samples or (asked.drift_chars and not text.drift)):
        left.append(f"text statistics on {text.targets} of {asked.samples} samples per setting"
                    + (", no drift" if asked.drift_chars and not text.drift else ""))
    if "recall" in by_owner:
        left.append("the recall figures exact, outside the budget")
    return line + f"within evaluation.budget={settings.budget} ({plan.budget:,} forward tokens)" + (
        f": {'; '.join(left)} (evaluation.budget=null: everything)" if left else ", everything exact")


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
    """Every figure of the evaluation as a metric: the modes' under modes/, the text statistics' values under
    text/<mode>/<decoder>/, every other number of its summary under its path there (loggers.figure_metrics: the
    context curve's context_curve/<w>, the cache's, any entry's); the best checkpoint's under best/."""
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
                     f"(stateful: {modes.curve['stateful']:.4f})")
            logger.experiment.log({"context_curve/table": table,
                                   "context_curve/plot": wandb.plot.line(table, "context_tokens", "bpc", title=title)})
        logger.log_table("samples/stateful_vs_stateless", columns=["prompt", "stateful", "stateless"],
                         data=[list(row) for row in zip(samples["prompts"], samples["stateful"], samples["stateless"])])
    logger.save()


# The seconds of a plan's passes on this machine, from a quick calibration (EvaluationClock): the forward passes of
# the model at the shapes the passes run (a batch of windows; the text statistics' sampling steps), timed once.
CALIBRATION_REPEATS = 3  # each shape timed this many times after a warm-up, the fastest kept


_CLOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class EvaluationClock:
    """Seconds per forward token of `model` on this machine, by the shape of the call, measured on first use (a few
    forward passes: well under a second for the study's models), so that the estimate says time, not tokens."""

    def __init__(self, model, seq_len: int):
        self.model, self.seq_len, self._seconds = model, int(seq_len), {}

    @classmethod
    def of(cls, model, seq_len: int) -> "EvaluationClock":
        """The model's clock, measured once per process (every estimate of a run reads the same)."""
        clock = _CLOCKS.get(model)
        if clock is None or clock.seq_len != int(seq_len):
            clock = _CLOCKS[model] = cls(model, seq_len)
        return clock

    def call(self, rows: int, length: int) -> float:
        """The seconds of one forward pass of `rows` x `length` tokens from a zero state (no gradient)."""
        key = (max(1, int(rows)), max(1, int(length)))
        if key not in self._seconds:
            import torch

            from gru_experiments.study.generation import eval_mode

            tokens = torch.zeros(key, dtype=torch.long, device=self.model.device)  # the global RNG untouched
            times = []
            with torch.no_grad(), eval_mode(self.model):
                for _ in range(CALIBRATION_REPEATS + 1):
                    started = time.perf_counter()
                    self.model(tokens)
                    times.append(time.perf_counter() - started)
            self._seconds[key] = min(times[1:])
        return self._seconds[key]

    def per_token(self, rows: int, length: int) -> float:
        return self.call(rows, length) / (max(1, rows) * max(1, length))

    def pass_seconds(self, p) -> float:
        """A pass's seconds: its forward tokens at the rate of its shape (the text statistics': text_seconds)."""
        if p.kind == TEXT:
            return self.text_seconds(p)
        if not p.forward_tokens:
            return 0.0
        length = getattr(p, "window", 0) or getattr(p, "chunk", 0) or self.seq_len
        length = min(length, self.seq_len * 8)
        return p.forward_tokens * self.per_token(max(1, WINDOW_BATCH_TOKENS // length), length)

    def text_seconds(self, p) -> float:
        """The text statistics' sampling (TextPass.calls): a step per token generated, in windowed mode a window
        of tokens per row, else one."""
        return sum(forward * self.per_token(rows, self.seq_len) if mode == WINDOWED else steps * self.call(rows, 1)
                   for mode, rows, steps, forward in p.calls)

    def plan_seconds(self, plan) -> float:
        return sum(self.pass_seconds(p) for p in plan.passes)


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
        epochs = max(int(trainer.max_epochs or 1) - trainer.current_epoch, 1)
        per_epoch = getattr(trainer, "num_training_batches", None)
        if isinstance(per_epoch, int) and per_epoch > 0:  # max_steps may end training before the epochs do
            epochs = max(min(epochs, math.ceil(int(total_steps) / per_epoch) - trainer.current_epoch), 1)
        clock = EvaluationClock.of(self.model, self.cfg.data.seq_len)
        final, best = self.plans(self.model, int(total_steps) * tokens_per_step)
        epoch_tokens = recipe_length(self.cfg)[1] * tokens_per_step
        modes = plan_for(self.modes.request(self.model) if self.modes is not None else
                         run_request(self.cfg, self.model, self.val, epoch_tokens, self.settings, OVER_TRAINING))
        chunks = self.val.n_targets * clock.per_token(self.cfg.data.get("eval_batch_size", 64), self.cfg.data.seq_len)
        estimate = {"step_seconds": step_seconds, "steps_left": steps_left,
                    "train_seconds": steps_left * step_seconds,
                    "validation_seconds": epochs * (chunks + clock.plan_seconds(modes)),
                    "eval_forward_tokens": final.forward_tokens, "eval_seconds": clock.plan_seconds(final),
                    "best_forward_tokens": best.forward_tokens, "best_seconds": clock.plan_seconds(best)}
        estimate["total_seconds"] = (estimate["train_seconds"] + estimate["validation_seconds"]
                                     + estimate["eval_seconds"])
        return estimate

    def plans(self, model, training_tokens: int):
        """The final weights' plan, and the best checkpoint's (run only where it is not the final one)."""
        final = run_request(self.cfg, model, self.val, training_tokens, self.settings, tokenizer=self.tokenizer,
                            train_ids=self.train_ids, probe=self.probe)
        return plan_for(final), plan_for(replace(final, purpose=BEST))

    def evaluation_forward_tokens(self, model, training_tokens: int) -> int:
        """The forward tokens of the final weights' plan: those the end-of-run evaluation runs."""
        return self.plans(model, training_tokens)[0].forward_tokens

    @staticmethod
    def describe(e: dict) -> str:
        return (f"estimated time left: {format_estimate(e['total_seconds'])} = training "
                f"{format_estimate(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
                f"+ validation {format_estimate(e['validation_seconds'])} + end-of-run evaluation "
                f"{format_estimate(e['eval_seconds'])} ("
                + (f"{e['eval_seconds']:.0f} s, " if e['eval_seconds'] >= 90 else "")
                + f"{e['eval_forward_tokens']:,} forward tokens; "
                f"evaluation.budget bounds it), and {format_estimate(e['best_seconds'])} more "
                f"({e['best_forward_tokens']:,}) if the best checkpoint is not the final weights")
