"""A value that would fail later or silently do something else, refused before any work starts: `validate(cfg)`
raises a UserError naming the key, the value and what is allowed (the engine: validation.py), and returns the run's
`RunSpec`: below train(), what the config asks for is read from it, never from the config (tests/test_spec.py).
"""

import importlib.util
import inspect
from typing import get_args

from omegaconf import OmegaConf

from gru_experiments.data.batches import BATCHINGS
from gru_experiments.data.corpus import corpus_name, no_test_split
from gru_experiments.data.recall_probe import NEEDS_CHAR, ProbeSettings
from gru_experiments.errors import UserError
from gru_experiments.runs.recipe import Recipe, recipe_length
from gru_experiments.runs.spec import RunSpec
from gru_experiments.study.evaluation import EvaluationSettings
from gru_experiments.validation import (
    MISSING,
    Rule,
    check_finite,
    check_rules,
    fraction,
    int_at_least,
    is_int,
    is_number,
    non_negative_number,
    open_fraction,
    positive_number,
    select,
)

TRAIN_RULES = [
    Rule("data.seq_len", int_at_least(2), "an integer >= 2 (a window needs an input and a next token)"),
    Rule("data.batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.eval_batch_size", int_at_least(1), "an integer >= 1"),
    Rule("data.train_fraction", open_fraction, "a number strictly between 0 and 1"),
    Rule("data.test_fraction", fraction, "a number >= 0 and below 1 (the corpus's last part held out as the test "
         "split; 0: none)", may_be_absent=True),
    Rule("data.validation_tokens", int_at_least(2), "null (the whole validation split) or an integer >= 2 (the "
         "validation split's first tokens that every validation over training scores)", optional=True),
    Rule("trainer.max_steps", lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (no limit) or an integer >= 1"),
    Rule("trainer.gradient_clip_val", non_negative_number, "a number >= 0", optional=True),
    Rule("low_precision_matmuls", lambda v: v in ("auto", "always", "never"), "auto, always or never",
         optional=True),
    Rule("cuda_graphs", lambda v: isinstance(v, bool), "true or false (true: on CUDA, the training step replayed "
         "from a CUDA graph)", may_be_absent=True),
    # null refused: it read as 0, where one could take it for "never" or "the default"
    Rule("checkpoint.every_n_steps", int_at_least(0), "an integer >= 0 (0: only at epoch ends)", may_be_absent=True),
    Rule("training.batching", lambda v: v in BATCHINGS, " or ".join(BATCHINGS) + " (data.BATCHINGS)",
         may_be_absent=True),
    Rule("training.recall_weight", lambda v: is_number(v) and v >= 1,
         "a number >= 1 (probe=recall: the loss's weight on a recall target; 1: every target the same)",
         may_be_absent=True),
]

# The recipe of a model trained with an optimizer (a counted model, e.g. the n-gram, has none).
RECIPE_RULES = [
    Rule("model.steps_per_epoch", int_at_least(1), "an integer >= 1"),
    Rule("model.epochs", int_at_least(1), "an integer >= 1"),
    Rule("model.lr", positive_number, "a number > 0"),
]

SPM_RULES = [
    Rule("tokenizer.vocab_size", int_at_least(2), "an integer >= 2"),
    Rule("tokenizer.model_type", lambda v: v in ("unigram", "bpe"), "'unigram' or 'bpe'", optional=True),
    Rule("tokenizer.character_coverage", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]",
         optional=True),
]


def check_precision(cfg, trained: bool) -> None:
    """trainer.precision: a value Lightning takes, its package installed, and for a model trained by AdamW (`trained`)
    not float16 weights: AdamW's state would be float16 too, where its eps (1e-8) is 0."""
    from lightning.fabric.plugins.precision import precision as lp

    allowed = get_args(lp._PRECISION_INPUT_STR) + get_args(lp._PRECISION_INPUT_INT) + get_args(
        lp._PRECISION_INPUT_STR_ALIAS)
    names = ", ".join(dict.fromkeys(str(p) for p in allowed))  # 16 and "16" named once
    check_rules(cfg, [Rule("trainer.precision", lambda v: v in allowed, f"one of {names}", optional=True)])
    precision = str(select(cfg, "trainer.precision"))
    if precision.startswith("transformer-engine") and importlib.util.find_spec("transformer_engine") is None:
        raise UserError(f"trainer.precision={precision} needs NVIDIA's Transformer Engine, and the transformer_engine "
                        "package is not installed (it runs on NVIDIA GPUs only: pip install "
                        "'transformer_engine[pytorch]'); bf16-mixed or 16-mixed need nothing more")
    if precision == "16-true" and trained:
        raise UserError("trainer.precision=16-true keeps the weights and AdamW's state in float16, where AdamW's eps "
                        "(1e-8) is 0 and so is the running square of any gradient below about 0.008: the first "
                        "update divides by zero and the weights become NaN or inf, whatever model.lr; use 16-mixed "
                        "(float16 compute, float32 weights), bf16-mixed or bf16-true")


# Groups whose keys this project reads as the chosen option's file names them: a key added to one on the command
# line (+group.key=value; Hydra refuses a new key without the +) is read by nothing. trainer, model and logger
# hand their keys on to Lightning, the model's class and the logger, which say what they take; early_stopping's
# (Lightning's EarlyStopping's) are checked in stopping.check_settings; probe: check_probe.
OWN_GROUPS = ("data", "evaluation", "training", "tokenizer", "optim", "checkpoint", "paths")


def check_added_keys(overrides=None, groups=()) -> None:
    """A key added on the command line that nothing reads is refused: `+key=value` at the top (only a config
    group, `groups`, may be added there) or in one of OWN_GROUPS. By default Hydra's command line."""
    from hydra.core.hydra_config import HydraConfig

    if overrides is None:
        if not HydraConfig.initialized():  # composed in Python (the API, a test): no command line
            return
        overrides, groups = HydraConfig.get().overrides.task, HydraConfig.get().runtime.choices
    for override in overrides:
        key = str(override).partition("=")[0]
        group, _, name = key.removeprefix("+").partition(".")
        if not key.startswith("+") or key.startswith("++"):  # ++ sets a key whether or not it exists: deliberate
            continue
        if not name and group not in groups:
            raise UserError(f"{group} is not a key of this command's config, so nothing would read it: leave out "
                            f"{key} (--cfg job lists the keys)")
        if group in OWN_GROUPS and name:
            raise UserError(f"{key[1:]} is not a key of the chosen {group} option, so nothing would read it: leave "
                            f"out {key}, or choose the {group} option that has it (conf/{group}/)")


def check_choices(overrides) -> None:
    """One model a run: a list of models or experiments, or a model beside an experiment, is refused."""
    chosen = {}
    for override in overrides:
        key, _, value = str(override).partition("=")
        group = key.lstrip("+~")
        if group in ("model", "experiment") and value != "null":
            if value.startswith("["):
                raise UserError(f"{override}: one {group} a run (a list merges them into one config, the last "
                                f"winning); each its own run: python sweep.py {group}s={value}")
            chosen[group] = value
    if len(chosen) == 2:
        raise UserError(f"model={chosen['model']}: experiment={chosen['experiment']} picks its own model "
                        "(conf/experiment/); give one of the two")


def validate(cfg) -> RunSpec:
    from hydra.core.hydra_config import HydraConfig

    # these import Lightning: only when validating
    from gru_experiments.runs.loggers import names_wandb, wandb_mode
    from gru_experiments.runs.stopping import check_settings

    check_added_keys()
    if HydraConfig.initialized():  # the command line: train.py, gru_experiments.train
        check_choices(HydraConfig.get().overrides.task)
    check_finite(OmegaConf.to_container(cfg, resolve=False))
    check_rules(cfg, TRAIN_RULES)
    if cfg.data.train_fraction + (test := OmegaConf.select(cfg, "data.test_fraction", default=0) or 0) >= 1:
        raise UserError(f"data.train_fraction={cfg.data.train_fraction} and data.test_fraction={test} leave no "
                        "validation split: their sum must be below 1")
    check_settings(cfg)  # early_stopping: its keys, Lightning's included (runs/stopping.py)
    if select(cfg, "trainer.max_epochs") is not MISSING:  # the trainer takes the model's (recipe.recipe_length)
        raise UserError("trainer.max_epochs: a run's epochs are its model's, model.epochs (trainer.max_steps cuts "
                        "them short)")
    evaluation = EvaluationSettings.of(cfg.evaluation, cfg.data.seq_len)
    recipe = check_model(cfg)
    probe = check_probe(cfg)
    check_scored_split(evaluation.split, cfg.data, probe)
    weight = select(cfg, "training.recall_weight")
    if probe is None and is_number(weight) and weight != 1:  # accepted: an experiment's pair without its probe
        print(f"training.recall_weight={weight} has no effect without probe=recall (it weighs the recall targets "
              "that the probe plants): every target weighs the same in this run")
    if select(cfg, "tokenizer.kind") == "spm":  # after the probe's check: a probe refuses any tokenizer but char
        check_rules(cfg, SPM_RULES)
    check_precision(cfg, trained=recipe is not None)
    if names_wandb(select(cfg, "logger._target_")):
        wandb_mode()  # a WANDB_MODE wandb would refuse (deep inside, with a traceback) fails here, before the run
    return RunSpec.of(cfg, recipe, probe, evaluation)


def check_scored_split(split: str, data, probe: ProbeSettings | None) -> None:
    """evaluation.split=test, before any work: a corpus with a test split, and no probe (its pairs are planted in the
    validation split)."""
    if split != "test":
        return
    if not (data.get("test_fraction") or 0):
        raise no_test_split(corpus_name(data.path, data.url, data.get("sha256")))
    if probe is not None:
        raise UserError("evaluation.split=test with probe=recall: the probe's pairs are planted in the validation "
                        "split only; score the test split without the probe")


def check_probe(cfg) -> ProbeSettings | None:
    """The probe group: none (or absent) with no key of the probe's, or recall with valid settings and the char
    tokenizer. A probe key without the probe, or probe.name=recall without the group's keys, is refused."""
    name = select(cfg, "probe.name")
    if name is MISSING:
        return ProbeSettings.from_config(cfg.get("probe"))
    given = [key for key in cfg.probe if key != "name"]
    if name == "none":
        if given:
            keys = ", ".join(f"probe.{key}" for key in given)
            raise UserError(f"probe.{given[0]} is a setting of probe=recall, but the probe is off (probe=none); "
                            f"add probe=recall to plant the pairs, or leave out {keys}")
        return None
    if name != "recall":
        raise UserError(f"invalid probe.name={name!r}: must be none or recall (the probe is chosen with the group: "
                        "probe=recall)")
    if not given:
        raise UserError("probe.name=recall names the probe but sets none of its keys: the probe is chosen with "
                        "its config group, probe=recall (probe.name is that group's record of itself)")
    if select(cfg, "tokenizer.kind") != "char":
        raise UserError(NEEDS_CHAR)
    return ProbeSettings.from_config(cfg.probe)


def check_model(cfg) -> Recipe | None:
    """The architecture, the window against what the model sees and, for a trained family, its recipe."""
    from gru_experiments.models.protocol import meta_model  # imports torch: only when validating

    architecture = select(cfg, "model.architecture")
    if architecture is MISSING or not hasattr(architecture, "keys"):
        raise UserError("invalid model.architecture: must be a mapping with _target_ and the model's settings")
    model = meta_model(architecture)
    # A window longer than the context is refused where that costs more than a token per prediction (a transformer:
    # seq_len x block_size tokens a window); the MLP and the n-gram take any seq_len.
    seq_len, context = select(cfg, "data.seq_len"), model.context
    if context is not None and model.tokens_per_prediction > 1 and is_int(seq_len) and seq_len > context:
        setting = "block_size" if "block_size" in inspect.signature(type(model)).parameters else "context"
        raise UserError(f"invalid data.seq_len={seq_len}: model {select(cfg, 'model.name')} sees at most {context} "
                        f"tokens (model.architecture.{setting}); set data.seq_len <= {context} or a larger {setting}")
    if model.trainable:
        check_rules(cfg, RECIPE_RULES)
        check_max_steps(cfg)
        return Recipe.from_config(cfg.optim)  # the optimiser recipe's own checks (runs/recipe.py)
    # epochs and steps_per_epoch mean nothing to it (preset=smoke sets them for every model);
    # a learning rate would suggest an optimizer that does not exist.
    if select(cfg, "model.lr") not in (MISSING, None):
        raise UserError(f"model.lr is not a setting of {type(model).__name__} ({model.family}): its weights are "
                        "counted from the training split, with no optimizer, epochs or steps")
    # accepted (a sweep gives its step limit and stopping to every model), but said: nothing reads them here
    unused = [f"trainer.max_steps={steps}" for steps in [select(cfg, "trainer.max_steps")] if is_int(steps)
              and steps != -1]
    stopping = select(cfg, "early_stopping")
    if stopping not in (MISSING, None) and stopping.get("patience") is not None:
        from gru_experiments.runs.stopping import defaults

        unused += [f"early_stopping.{key}={value}" for key, value in stopping.items()
                   if key != "_target_" and value != defaults().get(key, value)]
    if unused:
        print(f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect on {select(cfg, 'model.name')} "
              f"({type(model).__name__}, {model.family}): it is counted from the training split once and validated "
              "once, with no steps to limit or stop early")
    return None


def check_max_steps(cfg) -> None:
    """trainer.max_steps cuts a trained model's recipe short, never lengthens it: the trainer stops at the recipe's
    last epoch whatever max_steps says (4000 of a 2,000-step recipe trained 2,000), so one beyond it is refused."""
    epochs, per_epoch = recipe_length(cfg)
    max_steps = select(cfg, "trainer.max_steps")
    if is_int(max_steps) and max_steps > epochs * per_epoch:
        raise UserError(f"trainer.max_steps={max_steps} is beyond this model's recipe, model.epochs x "
                        f"model.steps_per_epoch = {epochs} x {per_epoch:,} = {epochs * per_epoch:,} steps, where "
                        "training ends whatever max_steps says; to train longer raise model.epochs "
                        f"(model.epochs={-(-max_steps // per_epoch)} trains {-(-max_steps // per_epoch) * per_epoch:,} "
                        f"steps, the schedule stretched over them), or give trainer.max_steps <= "
                        f"{epochs * per_epoch:,}")


def check_sizes(spec: RunSpec, model, train_tokens: int, val_tokens: int) -> None:
    """A context and a batch against the training split, the windowed mode's window against the validation split."""
    name, seq_len, batch_size = spec.model_name, spec.seq_len, spec.batch_size
    if model.context is not None and train_tokens < model.context + 1:
        raise UserError(f"the training split has {train_tokens} tokens, fewer than one context of {name} "
                        f"({model.context} tokens and the one they predict); use a longer corpus or a smaller context")
    if model.trainable and batch_size * seq_len > train_tokens:
        raise UserError(f"data.batch_size={batch_size} x data.seq_len={seq_len} is {batch_size * seq_len:,} tokens a "
                        f"batch, more than the training split's {train_tokens:,}: set data.batch_size to at most "
                        f"{max(train_tokens // seq_len, 1):,}")
    spec.evaluation.check_streams(val_tokens - 1)
    if spec.evaluation_window is not None:  # a window given (null: the training window, checked above)
        spec.evaluation.check_window(val_tokens - 1)


def check_trainer(spec: RunSpec, val_batches: int, trained: bool) -> None:
    """What Lightning itself refuses of the trainer group, refused before anything is written (it once refused it after
    a resume's record, with a traceback): its Trainer built of these settings (no logger, callbacks or checkpoints, so
    that nothing is written), and its batch limits against this run's batches (0.5 of one validation batch, say)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
    from lightning.pytorch.trainer.states import RunningStage

    try:
        trainer = instantiate(spec.trainer, max_epochs=spec.epochs, logger=False, callbacks=[],
                              enable_checkpointing=False)
        if trained:
            _parse_num_batches(RunningStage.TRAINING, spec.steps_per_epoch, trainer.limit_train_batches)
        _parse_num_batches(RunningStage.VALIDATING, val_batches, trainer.limit_val_batches)
    except (InstantiationException, MisconfigurationException, ValueError, TypeError) as error:
        reason = str(error.__cause__ if isinstance(error, InstantiationException) and error.__cause__ else error)
        raise UserError(f"Lightning refuses the trainer settings: {' '.join(reason.split())} (this run has "
                        f"{spec.steps_per_epoch:,} training and {val_batches:,} validation batches an epoch); nothing "
                        "was written") from None


def model_family(architecture) -> str | None:
    """The family an architecture builds (summary.json's "family"), or None: records never raise."""
    return _model_fact(architecture, lambda model: model.family)


def model_recurrent(architecture) -> bool | None:
    """Whether an architecture's model carries a state (summary.json's "recurrent", the protocol's), or None."""
    return _model_fact(architecture, lambda model: bool(model.recurrent))


def _model_fact(architecture, fact):
    from gru_experiments.models.protocol import meta_model

    try:
        return fact(meta_model(architecture))
    except Exception:  # noqa: BLE001 - bookkeeping never raises
        return None

