"""Every model config composes, has the study's exact parameter count, and trains a step."""

import importlib
import inspect
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from robustness_helpers import train

from gru_experiments.models.protocol import build_model, count_parameters
from gru_experiments.runs.recipe import recipe_length

# The study's table: vocabulary 65 (chars) and 1000 (SentencePiece) from Tiny Shakespeare.
EXPECTED = {
    "astra_alpha": ("gru", "char", 86_913),
    "astra_beta": ("gru", "char", 715_713),
    "astra_gamma": ("gru", "char", 4_383_041),
    "scribe_alpha": ("gru", "spm", 1_075_688),
    "scribe_beta": ("gru", "spm", 5_102_056),
    "scribe_gamma": ("gru", "spm", 14_439_400),
    "leviathan": ("lstm", "char", 24_248_129),
    # the ladder's rungs at Astra-α's scale
    "rnn": ("rnn", "char", 87_025),
    "lstm": ("lstm", "char", 87_174),
    "mlp": ("mlp", "char", 86_773),
    "mingru": ("mingru", "char", 87_047),
    "minlstm": ("minlstm", "char", 86_195),
    # minGRU and minLSTM at Astra-β's scale
    "mingru_beta": ("mingru", "char", 717_497),
    "minlstm_beta": ("minlstm", "char", 716_027),
}
ALL_CONFIGS = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "conf" / "model").glob("*.yaml"))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_count_to_the_unit(compose_config, name):
    cfg = compose_config(f"model={name}")
    family, tokenizer, expected = EXPECTED[name]
    assert cfg.model.name == name and cfg.tokenizer.kind == tokenizer
    vocab = 65 if tokenizer == "char" else cfg.tokenizer.vocab_size
    model = build_model(OmegaConf.to_container(cfg.model.architecture), vocab)
    assert model.family == family and count_parameters(model) == expected  # the model's family: no config key


def test_tokenizer_choice_can_be_overridden(compose_config):
    assert compose_config("model=scribe_beta", "tokenizer=char").tokenizer.kind == "char"
    assert compose_config("model=astra_beta", "tokenizer=spm").tokenizer.kind == "spm"


def test_recipe_and_trainer_are_overridable(compose_config):
    cfg = compose_config("model.lr=5e-4", "trainer.max_steps=300", "trainer.accelerator=cpu")
    assert cfg.model.lr == 5e-4 and cfg.trainer.max_steps == 300 and recipe_length(cfg)[0] == cfg.model.epochs


# Leviathan (24M parameters) takes half a minute for its step on a 2-core CPU, Scribe-γ (14M) 3 s, nanoGPT's model
# (10.7M, each stateful prediction a pass of 256 tokens) minutes for its evaluation: slow tests.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in ("leviathan", "nanogpt_shakespeare", "scribe_gamma") else name
                                  for name in ALL_CONFIGS])
def test_every_model_trains_one_step_on_tiny_data(compose_config, tiny_corpus, tmp_path, name):
    overrides = [f"model={name}", f"data.path={tiny_corpus}", "data.batch_size=2", "data.seq_len=16",
                 "trainer.max_steps=1", "++model.steps_per_epoch=1", "trainer.enable_progress_bar=false",
                 "trainer.accelerator=cpu"]
    if cfg_tokenizer(compose_config, name) == "spm":
        overrides.append("tokenizer.vocab_size=80")  # the tiny corpus cannot support 1000 pieces
    cfg = compose_config(*overrides)
    summary = train(cfg)
    assert summary["train_steps"] == (1 if summary["family"] != "ngram" else 0) and summary["model"] == name
    on_disk = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    for key in ["model", "family", "tokenizer", "vocab_size", "parameters", "train_loss", "val_loss", "val_bpc",
                "tokens_per_second", "wall_seconds", "checkpoint"]:
        assert key in on_disk
    assert Path(on_disk["checkpoint"]).is_file()


def cfg_tokenizer(compose_config, name: str) -> str:
    return compose_config(f"model={name}").tokenizer.kind


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_every_setting_with_a_default_is_in_the_model_yaml(compose_config, name):
    """A key the model's class accepts, with a default, is written in its YAML with that default: overriding it
    then needs no `+` (model.architecture.forget_bias=1, not +model.architecture.forget_bias=1)."""
    architecture = compose_config(f"model={name}").model.architecture
    module, _, cls = architecture._target_.rpartition(".")
    parameters = inspect.signature(getattr(importlib.import_module(module), cls).__init__).parameters.values()
    defaults = {p.name for p in parameters if p.default is not inspect.Parameter.empty}
    assert defaults - set(architecture) == set(), f"conf/model/{name}.yaml lacks these keys"
