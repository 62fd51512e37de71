"""What a valid value is, checked before any work starts.

Hydra catches unknown group options (model=..., tokenizer=..., inference=...) and unknown
keys; this module catches known keys with values that would fail later, after minutes of
corpus preparation or training, or that would silently do something else: a negative
learning rate, dropout of 1, a sequence length of 1, an unknown precision.

`validate(cfg)` checks a composed train config (the `evaluation` group and, with logger=wandb,
the WANDB_MODE environment variable included); `validate_sampling(settings, vocab_size)` checks
sampling settings (used by sample.py and the Python API; inference.generate adds the check that
the request fits in memory). Both raise a UserError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import OmegaConf

from gru_experiments.errors import UserError

_MISSING = object()


@dataclass(frozen=True)
class Rule:
    key: str  # dotted path in the config
    check: Callable[[Any], bool]
    allowed: str  # what the value must be, in words
    optional: bool = False  # the key may be absent or null
    may_be_absent: bool = False  # the key may be absent (but not null: optional says that)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and v >= low


def positive_number(v) -> bool:
    return _is_number(v) and v > 0


def non_negative_number(v) -> bool:
    return _is_number(v) and v >= 0


def open_fraction(v) -> bool:  # (0, 1)
    return _is_number(v) and 0 < v < 1


TRAIN_RULES = [
    Rule("data.seq_len", int_at_least(2), "an integer >= 2 (a window needs an input and a next token)"),
    Rule("data.batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.eval_batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.train_fraction", open_fraction, "a number strictly between 0 and 1"),
    Rule("weight_decay", non_negative_number, "a number >= 0"),
    Rule("trainer.max_steps", lambda v: _is_int(v) and (v == -1 or v >= 1), "-1 (no limit) or an integer >= 1"),
    Rule("trainer.gradient_clip_val", non_negative_number, "a number >= 0", optional=True),
    Rule("low_precision_matmuls", lambda v: v in ("auto", "always", "never"), "auto, always or never",
         optional=True),
    Rule("checkpoint.every_n_steps", int_at_least(0), "an integer >= 0 (0: only at epoch ends)", optional=True),
    Rule("training.batching", lambda v: v in ("windows", "streams"), "windows or streams (data.BATCHINGS)",
         may_be_absent=True),
]

# The recipe of a model trained with an optimizer (a counted model, e.g. the n-gram, has none).
RECIPE_RULES = [
    Rule("model.steps_per_epoch", int_at_least(1), "an integer >= 1"),
    Rule("model.epochs", int_at_least(1), "an integer >= 1"),
    Rule("model.lr", positive_number, "a number > 0"),
]

# The end-of-training evaluation (conf/evaluation/default.yaml); sample.py evaluate=true reads the same.
EVALUATION_RULES = [
    Rule("evaluation.streams", int_at_least(1), "an integer >= 1", may_be_absent=True),
    Rule("evaluation.window", int_at_least(1), "null (the training data.seq_len) or an integer >= 1",
         optional=True),
    Rule("evaluation.windowed_stride", lambda v: v == "auto" or int_at_least(1)(v),
         "auto or an integer >= 1 (1: every target)", may_be_absent=True),
    Rule("evaluation.curve_point_tokens", int_at_least(1), "null (exact points) or an integer >= 1",
         optional=True),
    Rule("evaluation.curve_longest", int_at_least(1), "null (the curve stops at data.seq_len) or an integer >= 1",
         optional=True),
    Rule("evaluation.long_point_tokens", int_at_least(1), "null (exact points) or an integer >= 1", optional=True),
    Rule("evaluation.max_tokens", int_at_least(1), "null (the whole split) or an integer >= 1 (targets)",
         optional=True),
    Rule("evaluation.batch_tokens", int_at_least(1), "an integer >= 1", may_be_absent=True),
    Rule("evaluation.sample_chars", int_at_least(1), "an integer >= 1", may_be_absent=True),
    Rule("evaluation.sample_temperature", non_negative_number, "a number >= 0 (0: the argmax)",
         may_be_absent=True),
]

SPM_RULES = [
    Rule("tokenizer.vocab_size", int_at_least(2), "an integer >= 2"),
    Rule("tokenizer.model_type", lambda v: v in ("unigram", "bpe"), "'unigram' or 'bpe'", optional=True),
    Rule("tokenizer.character_coverage", lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]",
         optional=True),
]


def _select(cfg, key: str):
    return OmegaConf.select(cfg, key, default=_MISSING) if OmegaConf.is_config(cfg) else _dotted_get(cfg, key)


def _dotted_get(mapping, key: str):
    value = mapping
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def check_rules(cfg, rules: list[Rule], prefix: str = "") -> None:
    for rule in rules:
        value = _select(cfg, rule.key)
        if (value is _MISSING or value is None) and rule.optional:
            continue
        if value is _MISSING and rule.may_be_absent:
            continue
        if value is _MISSING or not rule.check(value):
            shown = "missing" if value is _MISSING else repr(value)
            raise UserError(f"invalid {prefix}{rule.key}={shown}: must be {rule.allowed}")


def valid_precisions() -> tuple:
    """Every precision Lightning's Trainer accepts (strings such as '32-true', 'bf16-mixed', and 16/32/64)."""
    from typing import get_args

    from lightning.fabric.plugins.precision import precision as lp

    return get_args(lp._PRECISION_INPUT_STR) + get_args(lp._PRECISION_INPUT_INT) + get_args(
        lp._PRECISION_INPUT_STR_ALIAS)


def validate(cfg) -> None:
    """Check a composed train config; raise UserError on the first invalid value."""
    check_rules(cfg, TRAIN_RULES)
    check_rules(cfg, EVALUATION_RULES)
    check_model(cfg)
    if _select(cfg, "tokenizer.kind") == "spm":
        check_rules(cfg, SPM_RULES)
    precision = _select(cfg, "trainer.precision")
    if precision is not _MISSING and precision is not None:
        allowed = valid_precisions()
        if precision not in allowed:
            names = dict.fromkeys(str(p) for p in allowed)  # 16 and "16" read the same
            raise UserError(f"invalid trainer.precision={precision!r}: must be one of {', '.join(names)}")
    if str(_select(cfg, "logger._target_")).endswith("WandbLogger"):
        from gru_experiments.loggers import wandb_mode

        wandb_mode()  # a WANDB_MODE wandb would refuse (deep inside, with a traceback) fails here, before the run


def check_model(cfg) -> None:
    """The architecture (its class, settings and values: the family checks its own) and, for a
    trained family, its recipe; a counted family (trainable = False) takes no recipe."""
    from gru_experiments.language_model import validate_architecture  # imports torch: only when validating

    architecture = _select(cfg, "model.architecture")
    if architecture is _MISSING or not hasattr(architecture, "keys"):
        raise UserError("invalid model.architecture: must be a mapping with _target_ and the model's settings")
    family = validate_architecture(architecture)
    if family.trainable:
        check_rules(cfg, RECIPE_RULES)
        return
    # epochs and steps_per_epoch mean nothing to it (preset=smoke sets them for every model);
    # a learning rate would suggest an optimizer that does not exist.
    if _select(cfg, "model.lr") not in (_MISSING, None):
        raise UserError(f"model.lr is not a setting of {family.__name__} ({family.family}): its weights are "
                        "counted from the training split, with no optimizer, epochs or steps")


def validate_sampling(settings, vocab_size: int | None, prefix: str = "") -> None:
    """Check sampling settings (a dict or DictConfig with any of temperature, top_k, top_p,
    num_tokens, num_samples, max_new_tokens, window, seed, greedy); absent keys are skipped,
    null top_k, top_p and window mean "off" (window: the caller's default). `vocab_size` bounds
    top_k (None: not known yet, so only top_k >= 1 is checked). `prefix` is how the keys are
    spelled on the command line, e.g. "sample." gives "invalid sample.top_k=0".

    The one home of these checks: sample.py and the Python API (gru_experiments/api.py) call it,
    and inference.generate calls it for num_samples, max_new_tokens and window.
    """
    top_k = "null (off) or an integer from 1 to the vocabulary size"
    top_k = ((lambda v: _is_int(v) and 1 <= v <= vocab_size), f"{top_k} {vocab_size}") if vocab_size is not None \
        else (int_at_least(1), top_k)
    rules = [
        Rule("temperature", positive_number, "a number > 0", optional=True),
        Rule("top_k", *top_k, optional=True),
        Rule("top_p", lambda v: _is_number(v) and 0 < v <= 1, "null (off) or a number in (0, 1]", optional=True),
        Rule("num_tokens", int_at_least(0), "an integer >= 0", optional=True),
        Rule("num_samples", int_at_least(1), "an integer >= 1", may_be_absent=True),
        Rule("max_new_tokens", int_at_least(1), "an integer >= 1", may_be_absent=True),
        Rule("window", int_at_least(1), "null or an integer >= 1 (tokens of context)", optional=True),
        Rule("seed", _is_int, "an integer", may_be_absent=True),
        Rule("greedy", lambda v: isinstance(v, bool), "true or false", may_be_absent=True),
    ]
    check_rules(settings, rules, prefix)
