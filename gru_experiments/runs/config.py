"""What a valid value is, checked before any work starts.

Hydra catches unknown group options (model=..., tokenizer=..., inference=...) and unknown
keys; this module catches known keys with values that would fail later, after minutes of
corpus preparation or training, or that would silently do something else: a negative
learning rate, dropout of 1, a sequence length of 1, an unknown precision.

`validate(cfg)` checks a composed train config (the `evaluation` group and, with logger=wandb,
the WANDB_MODE environment variable included) and raises a UserError naming the key, the value
and what is allowed. The rule engine is gru_experiments/validation.py; the sampling settings'
rules are study/inference.validate_sampling.
"""

from __future__ import annotations

from gru_experiments.errors import UserError
from gru_experiments.validation import (MISSING, Rule, check_rules, int_at_least, is_int, is_number,
                                        non_negative_number, open_fraction, positive_number, select)

TRAIN_RULES = [
    Rule("data.seq_len", int_at_least(2), "an integer >= 2 (a window needs an input and a next token)"),
    Rule("data.batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.eval_batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.train_fraction", open_fraction, "a number strictly between 0 and 1"),
    Rule("weight_decay", non_negative_number, "a number >= 0"),
    Rule("trainer.max_steps", lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (no limit) or an integer >= 1"),
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
    Rule("evaluation.validation_tokens", int_at_least(1), "null (exact) or an integer >= 1 (forward tokens)",
         optional=True),
    Rule("evaluation.batch_tokens", int_at_least(1), "an integer >= 1", may_be_absent=True),
    Rule("evaluation.sample_chars", int_at_least(1), "an integer >= 1", may_be_absent=True),
    Rule("evaluation.sample_temperature", non_negative_number, "a number >= 0 (0: the argmax)",
         may_be_absent=True),
]

SPM_RULES = [
    Rule("tokenizer.vocab_size", int_at_least(2), "an integer >= 2"),
    Rule("tokenizer.model_type", lambda v: v in ("unigram", "bpe"), "'unigram' or 'bpe'", optional=True),
    Rule("tokenizer.character_coverage", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]",
         optional=True),
]


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
    if select(cfg, "tokenizer.kind") == "spm":
        check_rules(cfg, SPM_RULES)
    precision = select(cfg, "trainer.precision")
    if precision is not MISSING and precision is not None:
        allowed = valid_precisions()
        if precision not in allowed:
            names = dict.fromkeys(str(p) for p in allowed)  # 16 and "16" read the same
            raise UserError(f"invalid trainer.precision={precision!r}: must be one of {', '.join(names)}")
    if str(select(cfg, "logger._target_")).endswith("WandbLogger"):
        from gru_experiments.runs.loggers import wandb_mode

        wandb_mode()  # a WANDB_MODE wandb would refuse (deep inside, with a traceback) fails here, before the run


def check_model(cfg) -> None:
    """The architecture (its class, settings and values: the family checks its own) and, for a
    trained family, its recipe; a counted family (trainable = False) takes no recipe."""
    from gru_experiments.models.protocol import validate_architecture  # imports torch: only when validating

    architecture = select(cfg, "model.architecture")
    if architecture is MISSING or not hasattr(architecture, "keys"):
        raise UserError("invalid model.architecture: must be a mapping with _target_ and the model's settings")
    family = validate_architecture(architecture)
    if family.trainable:
        check_rules(cfg, RECIPE_RULES)
        return
    # epochs and steps_per_epoch mean nothing to it (preset=smoke sets them for every model);
    # a learning rate would suggest an optimizer that does not exist.
    if select(cfg, "model.lr") not in (MISSING, None):
        raise UserError(f"model.lr is not a setting of {family.__name__} ({family.family}): its weights are "
                        "counted from the training split, with no optimizer, epochs or steps")
