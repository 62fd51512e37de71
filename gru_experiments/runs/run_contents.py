"""A run folder is data, not code: the one allow-list of the callables a run's saved files may name (each `_target_`,
hydra.yaml's launcher, sweeper and logging classes), checked before anything of them is built or written; any other is
refused in one line naming the key and the file. What this command line names is the user's own. Why and how:
docs/robustness.md, *What a run folder may contain*.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.runs.run_dir import HYDRA, RunDir, refuse_older_layout
from gru_experiments.validation import select

TRAINER = "lightning.pytorch.Trainer"  # conf/trainer/
LOGGERS = ("lightning.pytorch.loggers.CSVLogger", "lightning.pytorch.loggers.WandbLogger")  # conf/logger/
EARLY_STOPPING = "gru_experiments.runs.stopping.EarlyStopping"  # conf/early_stopping/
RECIPE = "gru_experiments.runs.recipe.Recipe"  # conf/optim/ (recipe.TARGET)
MODEL = "model.architecture._target_"  # a model class of the package (models/protocol.model_class)
MODEL_PACKAGE = "gru_experiments.models."
# Where a run's config may name a callable, and which: every other `_target_` in it is refused.
CONFIG_TARGETS = {"trainer._target_": (TRAINER,), "logger._target_": LOGGERS,
                  "early_stopping._target_": (EARLY_STOPPING,), "optim._target_": (RECIPE,), MODEL: ()}
# hydra.yaml's (and a sweep's multirun.yaml's): Hydra's own launcher and sweeper, and those conf/hydra/launcher/ offers
HYDRA_TARGETS = {
    "hydra.launcher._target_": ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                                "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
                                "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
                                "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"),
    "hydra.sweeper._target_": ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper",)}
# Python's logging config in hydra.yaml (hydra.job_logging, hydra.hydra_logging): its handlers' and formatters' classes
# from the standard library, its streams the standard ones
LOGGING = ("hydra.job_logging", "hydra.hydra_logging")
LOGGING_CLASSES = "logging."
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")


def allowed(key: str, value) -> bool:
    """Whether a run's saved files may name `value` at `key` (a dotted key: `logger._target_`)."""
    if key == MODEL:
        return isinstance(value, str) and value.startswith(MODEL_PACKAGE) and _package_model(value)
    if key in CONFIG_TARGETS or key in HYDRA_TARGETS:
        return value in {**CONFIG_TARGETS, **HYDRA_TARGETS}[key]
    if key.startswith(LOGGING):
        leaf = key.rpartition(".")[2]
        if leaf in ("class", "()"):
            return isinstance(value, str) and value.startswith(LOGGING_CLASSES)
        return not (isinstance(value, str) and value.startswith("ext://")) or value in LOGGING_STREAMS
    return False


def _package_model(target: str) -> bool:
    from gru_experiments.models.protocol import model_class  # imports torch: only for a model's target
    try:
        model_class(target, from_checkpoint=True)  # a LanguageModel of the package: imports the package alone
        return True
    except UserError:
        return False


def callables(record, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of everything in a plain record that names a callable: each `_target_`, the logging
    config's `class`, `()` and `ext://` values, and in a recorded command line each override naming a `_target_`."""
    found = []
    if isinstance(record, dict):
        for key, value in record.items():
            dotted = f"{prefix}{key}"
            if key == "_target_" or (dotted.startswith(LOGGING) and (
                    key in ("class", "()") or isinstance(value, str) and value.startswith("ext://"))):
                found.append((dotted, value))
            elif isinstance(value, (dict, list)):
                found += callables(value, dotted + ".")
    elif isinstance(record, list):
        for index, item in enumerate(record):
            if isinstance(item, str) and "=" in item and "_target_" in item:
                key, _, value = item.partition("=")
                found.append((key.lstrip("+~"), value))
            elif isinstance(item, (dict, list)):
                found += callables(item, f"{prefix}{index}.")
    return found


def saved_files(folder: Path) -> list[Path]:
    """The files of a run folder that record a config or a command line: .hydra/ and each resume's record in it."""
    hydra = Path(folder) / HYDRA
    return sorted(p for p in [*hydra.glob("*.yaml"), *hydra.glob("resumed_*/*.yaml")] if p.is_file())


def check_record(record, where, named=None, own=None) -> None:
    """UserError, in one line naming the key and `where`, for a callable in `record` that the allow-list does not name.
    The user's own: a key `named` on this command line (or under one), and a value equal to `own`'s at that key."""
    plain = OmegaConf.to_container(record, resolve=False) if OmegaConf.is_config(record) else record
    typed = named is not None or own is not None  # a command that takes a _target_ of its own (train.py's resume)
    for key, value in callables(plain):
        typed_now = any(key == n or key.startswith(f"{n}.") for n in named or ()) or _own(own, key, value)
        if allowed(key, value) or typed_now:
            continue
        raise UserError(f"{where}: {key}={value!r} names a callable this project does not build from a run folder (a "
                        f"run folder is data, not code; {_what_it_may_name(key)}); nothing was run or written: "
                        "restore the file" + (f", or give {key} on the command line" if typed else ""))


def _own(own, key: str, value) -> bool:
    try:
        return own is not None and select(own, key) == value
    except Exception:  # noqa: BLE001 - a key that resolves only inside its job is no value of the command's
        return False


def _what_it_may_name(key: str) -> str:
    if key == MODEL:
        return f"{key} may name a model class of {MODEL_PACKAGE[:-1]}"
    if key in CONFIG_TARGETS or key in HYDRA_TARGETS:
        return f"{key} may name {' or '.join({**CONFIG_TARGETS, **HYDRA_TARGETS}[key])}"
    if key.startswith(LOGGING):
        return f"logging may name classes of {LOGGING_CLASSES[:-1]} and the streams {', '.join(LOGGING_STREAMS)}"
    return f"only {', '.join(CONFIG_TARGETS)} may name one"


def check_run_files(folder, named=None, upgrade=None) -> None:
    """Every config and command line a run folder records through `check_record` (a file that is not YAML is left to
    its reader); one of an older layout is refused as such (run_dir.refuse_older_layout)."""
    for path in saved_files(folder):
        try:
            record = OmegaConf.load(path)
        except Exception:  # noqa: BLE001 - a damaged file is its reader's to refuse (resume.saved_config)
            continue
        refuse_older_layout(record, folder, upgrade=upgrade)
        check_record(record, path, named)


def check_run(run: RunDir, named=None) -> None:
    """`check_run_files` of a RunDir's folder."""
    check_run_files(run.path, named)
