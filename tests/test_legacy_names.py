"""Run folders from before issue 35 still work, each old name said once in a printed line (run_dir.in_todays_names).

optim=seed is optim=original, model=astra_alpha_seed (transformer_seed, transformer_beta_seed) is
model=astra_alpha_original (...), and the flat evaluation keys (evaluation.text_samples, ...) are nested
(evaluation.text.samples, ...). In a run folder's saved config and summary, and in a checkpoint's
hyper-parameters: an old run folder, written here by today's code and then given the old names, loads, samples,
scores and resumes. A command line takes today's names only: an old one is refused in a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf
from robustness_helpers import TINY, run_script

import gru_experiments
from gru_experiments.runs import run_dir
from gru_experiments.runs.checkpoints import atomic_torch_save, read_checkpoint
from gru_experiments.runs.run_dir import MODELS, RunDir, in_todays_names, model_runs

MODEL_LINE = "model=astra_alpha_seed is now model=astra_alpha_original"
RECIPE_LINE = "optim=seed is now optim=original"
EVALUATION_LINE = "evaluation.text_samples, evaluation.text_chars"
FLAT = {"text_samples": 0, "text_chars": 300, "text_drift_chars": 4000, "sample_chars": 40, "sample_temperature": 1.0}


@pytest.fixture(autouse=True)
def fresh_lines(monkeypatch):
    """Each change is said once per process: every test starts with none said."""
    monkeypatch.setattr(run_dir, "_said", set())


def old_config():
    return OmegaConf.create({"model": {"name": "astra_alpha_seed", "lr": 3e-3}, "optim": {"name": "seed"},
                             "evaluation": {"budget": "${oc.select:model.eval_budget,1.0}", **FLAT}})


def test_in_todays_names_renames_each_old_name_once_in_a_line(capsys):
    cfg = in_todays_names(old_config())
    assert (cfg.model.name, cfg.optim.name) == ("astra_alpha_original", "original")
    assert OmegaConf.to_container(cfg.evaluation) == {
        "budget": "${oc.select:model.eval_budget,1.0}",  # an interpolation stays one
        "text": {"samples": 0, "chars": 300, "drift_chars": 4000}, "samples": {"chars": 40, "temperature": 1.0}}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith(RECIPE_LINE) and lines[1].startswith(MODEL_LINE)
    assert lines[2].startswith(EVALUATION_LINE) and "evaluation.samples.temperature" in lines[2]
    again = in_todays_names(cfg.copy())
    assert again == cfg and capsys.readouterr().out == ""  # idempotent, and said once
    in_todays_names(old_config())
    assert capsys.readouterr().out == ""  # the same change read again (a second reader): no second line
    # a checkpoint's hyper-parameters (a dict: model_name), and a config in today's names
    hp = in_todays_names({"model_name": "transformer_seed", "optim": {"name": "seed"}, "lr": 3e-3})
    assert hp == {"model_name": "transformer_original", "optim": {"name": "original"}, "lr": 3e-3}
    today = OmegaConf.create({"model": {"name": "astra_alpha"}, "optim": {"name": "transformer"},
                              "evaluation": {"text": {"samples": 12}}})
    assert in_todays_names(today.copy()) == today and in_todays_names(None) is None


def test_old_names_on_the_command_line_are_refused_in_a_line(tmp_path):
    result = run_script(tmp_path, "model=astra_alpha_seed", "--cfg", "job")
    assert result.returncode != 0 and "Could not find 'model/astra_alpha_seed'" in result.stderr


def test_old_keys_gone_since_are_left_out_of_an_old_config_with_a_line(capsys):
    old = OmegaConf.create({"weight_decay": 0.05, "evaluation": {"budget": 1.0, "windowed_stride": 64},
                            "trainer": {"max_epochs": "${oc.select:model.epochs,1}"},
                            "model": {"name": "astra_alpha", "eval_max_tokens": 10}})
    cfg = in_todays_names(old)
    assert OmegaConf.to_container(cfg) == {"evaluation": {"budget": 1.0}, "model": {"name": "astra_alpha"},
                                           "trainer": {}, "optim": {"name": "original", "weight_decay": 0.05}}
    gone = "trainer.max_epochs, evaluation.windowed_stride, model.eval_max_tokens: gone since"
    assert gone in capsys.readouterr().out


@pytest.mark.parametrize("old, new", MODELS.items())
def test_each_variant_is_its_old_model_config(compose_config, old, new):
    """model=<variant> composes what model=<old> did before issue 35: the base model at the original
    study's learning rate (and, for the transformers, its recipe), under its own name."""
    cfg = compose_config(f"model={new}")
    base = compose_config(f"model={new.removesuffix('_original')}")
    assert cfg.model.name == new and cfg.optim.name == "original"
    assert cfg.model.lr == {"transformer_beta_original": 2e-3}.get(new, 3e-3)
    assert cfg.model.architecture == base.model.architecture and cfg.data == base.data


# --- an old run folder -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def old_run(tmp_path_factory, tiny_corpus) -> Path:
    """A finished astra_alpha_original run of a few steps, as the code before issue 35 wrote it: under
    runs/astra_alpha_seed/, optim.name seed and the flat evaluation keys in its config, model=astra_alpha_seed in
    its overrides, astra_alpha_seed in its summary and its checkpoints' hyper-parameters."""
    root = tmp_path_factory.mktemp("old")
    run = root / "outputs" / "runs" / "astra_alpha_seed" / "2026-01-01_00-00-00_000000"
    gru_experiments.train([*TINY, f"data.path={tiny_corpus}", "model=astra_alpha_original", f"hydra.run.dir={run}",
                           "model.steps_per_epoch=3", "model.epochs=1", "evaluation.text.samples=0",
                           "evaluation.samples.chars=40", "evaluation.budget=1"], root=root)
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    cfg.model.name, cfg.optim.name = "astra_alpha_seed", "seed"
    for key in ("text", "samples"):
        del cfg.evaluation[key]
    cfg.evaluation.update(FLAT)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    overrides = OmegaConf.load(run / ".hydra" / "overrides.yaml")
    old = {"model=astra_alpha_original": "model=astra_alpha_seed", "evaluation.text.samples=0":
           "evaluation.text_samples=0", "evaluation.samples.chars=40": "evaluation.sample_chars=40"}
    OmegaConf.save([old.get(o, o) for o in overrides], run / ".hydra" / "overrides.yaml")
    (run / "summary.json").write_text(json.dumps({**json.loads((run / "summary.json").read_text()),
                                                  "model": "astra_alpha_seed"}))
    for path in (run / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)  # as written: read_checkpoint would upgrade it
        checkpoint["hyper_parameters"].update(model_name="astra_alpha_seed", optim={
            **checkpoint["hyper_parameters"]["optim"], "name": "seed"})
        atomic_torch_save(checkpoint, path)
    return run


def test_an_old_run_folder_loads_in_todays_names_with_a_line_each(old_run, capsys):
    assert "astra_alpha_seed" in (old_run / ".hydra" / "config.yaml").read_text()  # the old shape
    lm = gru_experiments.load(old_run)
    assert lm.name == "astra_alpha_original" and lm.seq_len == 32
    config = RunDir(old_run).config()
    assert (config.model.name, config.optim.name, config.evaluation.samples.chars) == (
        "astra_alpha_original", "original", 40)
    assert read_checkpoint(old_run / "checkpoints" / "last.ckpt")["hyper_parameters"]["optim"]["name"] == "original"
    assert model_runs(old_run.parents[2], "astra_alpha_original") == [RunDir(old_run)]
    out = capsys.readouterr().out
    assert [out.count(line) for line in (MODEL_LINE, RECIPE_LINE, EVALUATION_LINE)] == [1, 1, 1]


def test_an_old_run_folder_samples_and_scores_with_sample_py(old_run, tmp_path):
    """sample.py run=RUN and run=RUN evaluate=true, as a user runs them: one line for each old name."""
    for extra in ([], ["evaluate=true"]):
        result = run_script(tmp_path, f"run={old_run}", "prompt=ab", "num_samples=1", "max_new_tokens=10", *extra,
                            script=REPO / "sample.py")
        assert result.returncode == 0, result.stderr[-3000:]
        assert [result.stdout.count(line) for line in (MODEL_LINE, RECIPE_LINE, EVALUATION_LINE)] == [1, 1, 1]
        assert "(astra_alpha_original: gru" in result.stdout
    assert (tmp_path / "outputs" / "samples" / "astra_alpha_original").is_dir()


def test_an_old_run_folder_resumes_in_todays_names(old_run, capsys):
    """Killed before its summary: resume=RUN continues it with its saved config in today's names, and it finishes
    as astra_alpha_original. (It runs last: it finishes the module's run folder.)"""
    run, root = old_run, old_run.parents[3]
    (run / "summary.json").unlink()
    summary = gru_experiments.train([f"resume={run}", "evaluation.budget=1"], root=root)
    assert summary["model"] == "astra_alpha_original" and summary["status"] == "completed"
    assert summary["train_steps"] == 3  # its own recipe: model.steps_per_epoch=3, not today's default
    out = capsys.readouterr().out
    assert [out.count(line) for line in (MODEL_LINE, RECIPE_LINE)] == [1, 1]
