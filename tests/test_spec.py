"""The run spec (issue 61): validate(cfg) returns one frozen RunSpec of plain values, and below the config layer no
module imports DictConfig: what the config asks for is read from the spec (as tests/test_layers.py holds the layers).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gru_experiments.data.recall_probe import ProbeSettings
from gru_experiments.runs.checks import validate
from gru_experiments.runs.recipe import Recipe
from gru_experiments.runs.spec import RunSpec
from gru_experiments.study.evaluation import EvaluationSettings

PACKAGE = Path(__file__).resolve().parents[1] / "gru_experiments"
# The config layer: the package's modules that read the composed config itself, each with why (train.py, sample.py
# and sweep.py, outside the package, are the entry points above it). Every other module reads a RunSpec or plain
# values. runs/jobs.py and runs/resume.py read the config without the DictConfig type (OmegaConf.is_config).
CONFIG_LAYER = {
    "runs/checks.py": "the validation: checks the config and builds its RunSpec",
    "runs/spec.py": "the RunSpec: its one builder reads the checked config (RunSpec.of)",
    "validation.py": "the rules' engine, over a config or a dict",
    "api.py": "an entry point: composes train's and sample's configs",
    "runs/jobs.py": "the job wrapper: records a failure whose config may never have passed validation",
    "runs/resume.py": "composes a resumed run's config from its saved one and this command's",
    "runs/sample_checks.py": "sample.py's validation: checks its config and builds its SampleSpec",
    "runs/training.py": "train(cfg) alone: hands the config to the job wrapper, the resume and validate",
}


def imports_dictconfig(source: str) -> bool:
    """`from omegaconf import DictConfig` (from any module) or `omegaconf.DictConfig` anywhere in `source`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "DictConfig" for alias in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "DictConfig":
            return True
    return False


def modules_importing_dictconfig(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*.py")
            if imports_dictconfig(path.read_text(encoding="utf-8"))}


def test_only_the_config_layer_imports_dictconfig():
    assert modules_importing_dictconfig(PACKAGE) <= set(CONFIG_LAYER), \
        "a module below the config layer imports DictConfig: read the RunSpec (runs/spec.py), or plain values"
    assert all((PACKAGE / module).is_file() for module in CONFIG_LAYER)


def test_the_check_sees_every_spelling():
    assert imports_dictconfig("from omegaconf import DictConfig, OmegaConf\n")
    assert imports_dictconfig("from omegaconf.dictconfig import DictConfig as D\n")
    assert imports_dictconfig("import omegaconf\n\ndef f(cfg: omegaconf.DictConfig): ...\n")
    assert not imports_dictconfig("from omegaconf import OmegaConf\n\nOmegaConf.is_config(x)\n")


def plain(value) -> bool:
    """Plain Python all the way down: no OmegaConf node in a dict, list or tuple (nor a dataclass's fields)."""
    if OmegaConf.is_config(value):
        return False
    if isinstance(value, dict):
        return all(plain(k) and plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(map(plain, value))
    if dataclasses.is_dataclass(value):
        return all(plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True


def test_validate_returns_one_frozen_spec_of_plain_values(compose_config, tmp_path, data_dir):
    spec = validate(compose_config("model=astra_alpha", "training=streams", "probe=recall", "logger=csv",
                                   "early_stopping.patience=2", "trainer.max_steps=3", "data.batch_size=8"))
    assert isinstance(spec, RunSpec) and plain(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1
    assert (spec.model_name, spec.seed, spec.lr, spec.epochs, spec.steps_per_epoch) == ("astra_alpha", 1234, 1e-2, 10,
                                                                                        200)
    assert spec.architecture == {"_target_": "gru_experiments.models.recurrent.RecurrentLM", "cell": "gru",
                                 "embedding_dim": 64, "hidden_size": 128, "num_layers": 1, "dropout": 0.1,
                                 "layer_norm": False, "implementation": "fast", "forget_bias": 0.0}
    assert isinstance(spec.recipe, Recipe) and spec.recipe.name == "original"
    assert isinstance(spec.probe, ProbeSettings) and isinstance(spec.evaluation, EvaluationSettings)
    assert (spec.seq_len, spec.batch_size, spec.eval_batch_size, spec.tokens_per_step) == (128, 8, 256, 8 * 128)
    assert (spec.batching, spec.recall_weight, spec.evaluation_window) == ("streams", 1, None)
    assert spec.data["cache_dir"] == str(data_dir) and spec.tokenizer == {"kind": "char"}
    assert (spec.smoke, spec.progress_bars, spec.precision, spec.low_precision_matmuls, spec.cuda_graphs) == (
        False, True, None, "auto", True)
    assert spec.checkpoint_every_n_steps == 100 and spec.trainer["max_steps"] == 3
    assert spec.trainer["_target_"] == "lightning.pytorch.Trainer"
    assert spec.early_stopping["patience"] == 2 and spec.early_stopping["_target_"].endswith("EarlyStopping")
    assert spec.logger["_target_"] == "lightning.pytorch.loggers.CSVLogger"
    assert spec.logger["save_dir"] == str(tmp_path / "run")  # resolved
    assert (spec.output_dir, spec.data_dir) == (tmp_path / "run", data_dir)
    # the config as recorded (unresolved) and as the loggers take it (resolved)
    assert spec.config["data"]["cache_dir"] == "${paths.data_dir}"
    assert spec.resolved_config["data"]["cache_dir"] == str(data_dir)


def test_a_counted_model_and_switched_off_settings(compose_config):
    spec = validate(compose_config("model=ngram", "trainer.fast_dev_run=true", "trainer.enable_progress_bar=false",
                                   "checkpoint.every_n_steps=0"))
    assert (spec.recipe, spec.lr, spec.epochs, spec.steps_per_epoch) == (None, None, 1, 1)
    assert (spec.probe, spec.early_stopping, spec.logger) == (None, None, None)  # off: probe, patience, logger
    assert (spec.batching, spec.smoke, spec.progress_bars, spec.checkpoint_every_n_steps) == ("windows", True, False, 0)
