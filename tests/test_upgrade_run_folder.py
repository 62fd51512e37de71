"""Run folders of an older layout leave the package: it refuses one in one line naming tools/upgrade_run_folder.py,
writing nothing, and the script upgrades it in place, once, after which it loads, samples, resumes and reports as a
run of today's; a second call changes nothing. The old folder is written here by today's code and then given the
old names (docs/configuration.md, *Old names*)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import CONF, REPO
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from robustness_helpers import TINY, run_script
from test_findings import make_sweep
from test_recall_probe import single_phase
from test_recipe import V, shipped

import gru_experiments
from gru_experiments.data.recall_probe import ProbeSettings
from gru_experiments.errors import UserError
from gru_experiments.report.sweep_folder import collect
from gru_experiments.runs.checkpoints import atomic_torch_save
from gru_experiments.runs.run_dir import RunDir, model_runs, older_layout
from gru_experiments.runs.task import LanguageModelTask

SPEC = importlib.util.spec_from_file_location("upgrade_run_folder", REPO / "tools" / "upgrade_run_folder.py")
TOOL = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(TOOL)

FLAT = {"text_samples": 0, "text_chars": 300, "text_drift_chars": 4000, "sample_chars": 40, "sample_temperature": 1.0}
FLAT_LAYOUT_CLASS = "gru_experiments.model.RecurrentLM"  # a checkpoint's model class before the models/ subpackage


def refusal(where, upgrade, kind: str = "run folder") -> str:
    return (f"{where}: a {kind} of an older layout (optim.name=seed); upgrade it once with: "
            f"python tools/upgrade_run_folder.py {upgrade}")


def snapshot(folder: Path) -> dict:
    return {path.relative_to(folder): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def aged(config: dict) -> dict:
    """A run config (plain) as the code before issue 35 wrote it: optim.name seed, model astra_alpha_seed, the flat
    evaluation keys."""
    config["model"]["name"], config["optim"]["name"] = "astra_alpha_seed", "seed"
    for key in ("text", "samples"):
        del config["evaluation"][key]
    config["evaluation"].update(FLAT)
    return config


@pytest.fixture
def old_run(tmp_path, tiny_corpus) -> Path:
    """<tmp_path>/outputs/runs/astra_alpha_seed/<time>: a finished astra_alpha_original run of a few steps, as older
    code wrote it: the old names in its config, overrides, summary and checkpoints (hyper-parameters and recorded
    config), its checkpoints' model class by its flat-layout path, and a summary without the training's mode,
    window or recurrence. (Its own for each test: a checkpoint records the best one's path, absolute.)"""
    root = tmp_path
    run = root / "outputs" / "runs" / "astra_alpha_seed" / "2026-01-01_00-00-00_000000"
    gru_experiments.train([*TINY, f"data.path={tiny_corpus}", "model=astra_alpha_original", f"hydra.run.dir={run}",
                           "model.steps_per_epoch=3", "model.epochs=1", "evaluation.text.samples=0",
                           "evaluation.samples.chars=40", "evaluation.budget=1"], root=root)
    config = run / ".hydra" / "config.yaml"
    OmegaConf.save(aged(OmegaConf.to_container(OmegaConf.load(config))), config)
    overrides = OmegaConf.load(run / ".hydra" / "overrides.yaml")
    old = {"model=astra_alpha_original": "model=astra_alpha_seed", "evaluation.text.samples=0":
           "evaluation.text_samples=0", "evaluation.samples.chars=40": "evaluation.sample_chars=40"}
    OmegaConf.save([old.get(o, o) for o in overrides], run / ".hydra" / "overrides.yaml")
    summary = json.loads((run / "summary.json").read_text())
    for key in ("training_mode", "seq_len", "recurrent"):
        del summary[key]
    (run / "summary.json").write_text(json.dumps({**summary, "model": "astra_alpha_seed"}))
    for path in (run / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        hyper_parameters = checkpoint["hyper_parameters"]
        hyper_parameters.update(model_name="astra_alpha_seed", optim={**hyper_parameters["optim"], "name": "seed"})
        hyper_parameters["architecture"]["_target_"] = FLAT_LAYOUT_CLASS
        checkpoint["run_config"] = aged(checkpoint["run_config"])
        atomic_torch_save(checkpoint, path)
    return run


@pytest.mark.slow
def test_an_old_run_folder_is_refused_in_one_line_naming_the_script_and_nothing_is_written(old_run, tmp_path):
    root, run = tmp_path, old_run
    (run / "summary.json").unlink()  # killed before its summary: a run resume= would continue
    before, checkpoint = snapshot(run), run / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError) as refused:
        RunDir(run).config()
    assert str(refused.value) == refusal(run, run)
    with pytest.raises(UserError) as refused:
        gru_experiments.load(run)
    assert str(refused.value) == refusal(checkpoint, run, "checkpoint")
    with pytest.raises(UserError) as refused:
        gru_experiments.train([f"resume={run}", "evaluation.budget=1"], root=root)
    assert "of an older layout (optim.name=seed); upgrade it once with: python tools/upgrade_run_folder.py" in str(
        refused.value)
    sampled = run_script(root, f"run={run}", "prompt=ab", "num_samples=1", script=REPO / "sample.py")
    assert sampled.returncode == 2 and sampled.stderr.strip() == f"error: {refusal(checkpoint, run, 'checkpoint')}"
    assert snapshot(run) == before
    assert model_runs(root / "outputs", "astra_alpha") == []  # finding a model's runs passes over it, unrefused


@pytest.mark.slow
def test_the_script_upgrades_an_old_run_folder_once_and_it_then_works_as_a_new_one(old_run, tmp_path, capsys):
    root, run = tmp_path, old_run
    assert TOOL.main([str(run)]) == 0
    out = capsys.readouterr().out
    for line in (f"{run}/.hydra/config.yaml: optim=seed is now optim=original",
                 f"{run}/.hydra/config.yaml: evaluation.sample_chars is now evaluation.samples.chars",
                 f"{run}/.hydra/overrides.yaml: override model=astra_alpha_seed is now model=astra_alpha_original",
                 f"{run}/summary.json: summary model astra_alpha_seed is now astra_alpha_original",
                 f"{run}/summary.json: summary seq_len 32 added (the training window)",
                 f"{run}/checkpoints/last.ckpt: model=astra_alpha_seed is now model=astra_alpha_original",
                 f"{run}/checkpoints/last.ckpt: architecture._target_ {FLAT_LAYOUT_CLASS} is now "
                 "gru_experiments.models.recurrent.RecurrentLM",
                 f"{run}/checkpoints/last.ckpt: recorded config: optim=seed is now optim=original"):
        assert line in out.splitlines()
    assert out.splitlines()[-1].startswith(f"{run}: upgraded to today's layout (")
    upgraded = snapshot(run)
    assert TOOL.main([str(run)]) == 0  # once: a second call changes nothing, and says so
    assert capsys.readouterr().out == f"{run}: already in today's layout, nothing changed\n"
    assert snapshot(run) == upgraded

    lm = gru_experiments.load(run)
    assert lm.name == "astra_alpha_original" and lm.seq_len == 32
    config, summary = RunDir(run).config(), RunDir(run).summary()
    assert (config.model.name, config.optim.name, config.evaluation.samples.chars) == ("astra_alpha_original",
                                                                                       "original", 40)
    assert (summary["model"], summary["training_mode"], summary["seq_len"], summary["recurrent"]) == (
        "astra_alpha_original", "windows", 32, True)
    assert model_runs(root / "outputs", "astra_alpha_original") == [RunDir(run)]
    sampled = run_script(root, f"run={run}", "prompt=ab", "num_samples=1", "max_new_tokens=10",
                         script=REPO / "sample.py")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert "(astra_alpha_original: gru" in sampled.stdout
    (run / "summary.json").unlink()  # killed before its summary: resume=RUN continues it with its own recipe
    summary = gru_experiments.train([f"resume={run}", "evaluation.budget=1"], root=root)
    assert (summary["model"], summary["status"], summary["train_steps"]) == ("astra_alpha_original", "completed", 3)


def test_an_old_sweep_is_refused_naming_the_sweep_and_reports_in_todays_names_once_upgraded(tmp_path):
    """A sweep of model=astra_alpha_seed from before training=streams: its summary says "cell" for the family and
    keeps the training window in its mode evaluation's record."""
    sweep = make_sweep(tmp_path, models=[("astra_alpha_seed", "char", 86_913, 2.31, 3.78, 3.58)])
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - model=astra_alpha_seed\n")
    job = sweep / "0_astra_alpha_seed"
    config = OmegaConf.load(job / ".hydra" / "config.yaml")
    del config.training
    config.optim = {"name": "seed"}
    OmegaConf.save(config, job / ".hydra" / "config.yaml")
    summary = json.loads((job / "summary.json").read_text())
    summary.update(optim="seed", lr=0.01, cell=summary.pop("family"), mode_evaluation={"seq_len": 128, "window": 64})
    (job / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(UserError) as refused:
        collect(sweep)
    assert str(refused.value) == refusal(job, sweep)

    assert TOOL.main([str(sweep)]) == 0
    jobs, _ = collect(sweep)
    assert [(job.name, job.status, job.recipe, job.training, job.values["family"]) for job in jobs] == [
        ("astra_alpha_original", "completed", "original", "windows (128)", "gru")]  # planned: not also missing


def test_the_script_renames_each_old_name_in_a_line_and_leaves_todays_alone():
    old = {"model": {"name": "astra_alpha_seed", "eval_max_tokens": 10}, "optim": {"name": "seed"},
           "trainer": {"max_epochs": "${oc.select:model.epochs,1}"},
           "evaluation": {"budget": "${oc.select:model.eval_budget,1.0}", "windowed_stride": 64, **FLAT}}
    assert older_layout(OmegaConf.create(old)) == "optim.name=seed"
    said = TOOL.upgrade_record(old)
    assert old == {"model": {"name": "astra_alpha_original"}, "optim": {"name": "original"}, "trainer": {},
                   "training": {"batching": "windows"},
                   "evaluation": {"budget": "${oc.select:model.eval_budget,1.0}",  # an interpolation stays one
                                  "text": {"samples": 0, "chars": 300, "drift_chars": 4000},
                                  "samples": {"chars": 40, "temperature": 1.0}}}
    assert said[:2] == ["optim=seed is now optim=original", "model=astra_alpha_seed is now model=astra_alpha_original"]
    assert "trainer.max_epochs: gone since, left out" in said and "model.eval_max_tokens: gone since, left out" in said
    assert older_layout(OmegaConf.create(old)) is None and TOOL.upgrade_record(old) == []
    overrides = ["model=astra_alpha,astra_alpha_seed", "optim=seed", "evaluation.text_samples=0",
                 "evaluation.windowed_stride=20", "seed=1"]
    TOOL.upgrade_overrides(overrides)
    assert overrides == ["model=astra_alpha,astra_alpha_original", "optim=original", "evaluation.text.samples=0",
                         "seed=1"]


@pytest.mark.slow
def test_todays_configs_are_no_older_layout():
    """No shipped model, experiment or probe composes to what the package refuses."""
    choices = [f"{group}={path.stem}" for group in ("model", "experiment", "probe")
               for path in sorted((CONF / group).glob("*.yaml"))]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        found = {choice: older_layout(compose(config_name="train", overrides=[choice])) for choice in choices}
    assert found == dict.fromkeys(choices)


@pytest.mark.parametrize("weight_decay", [0.01, 0.05])
def test_a_checkpoint_from_before_conf_optim_gets_the_original_recipe(weight_decay):
    """Hyper-parameters with weight_decay and no optim (and a model class of none): refused, then upgraded to the
    original recipe at that decay, saved as optim, so the task's hparams rebuild the same recipe."""
    hyper_parameters = {"architecture": {"cell": "gru", "embedding_dim": 4, "hidden_size": 6, "num_layers": 1,
                                         "dropout": 0.0}, "vocab_size": V, "lr": 3e-3, "weight_decay": weight_decay,
                        "epochs": 1}
    assert older_layout(hyper_parameters) == "architecture._target_=None"
    TOOL.upgrade_record(hyper_parameters)
    assert older_layout(hyper_parameters) is None
    task = LanguageModelTask(**hyper_parameters)
    assert task.recipe == dataclasses.replace(shipped("original"), weight_decay=weight_decay)
    assert "optim" in task.hparams and "weight_decay" not in task.hparams
    assert LanguageModelTask(**task.hparams).recipe == task.recipe


def test_a_probe_from_before_the_phases_is_one_phase_validated_at_its_distances():
    old = {"probe": {"name": "recall", "keys": 16, "distances": [4, 8, 16], "gap": 8, "min_targets": 100}}
    assert older_layout(old) == "probe.distances=[4, 8, 16]"
    TOOL.upgrade_record(old)
    assert ProbeSettings.from_config(old["probe"]) == single_phase((4, 8, 16), 8, 100, 16)


def test_the_script_refuses_what_is_no_run_and_says_when_it_cannot_write(tmp_path, capsys, monkeypatch):
    """A text file or an unrelated folder: one line, exit status 2 (it said "already in today's layout" and exited 0);
    a run folder it cannot write: a line per file, exit status 1 (it said "unreadable", then "already in today's
    layout", and exited 0), the files as they were."""
    text = tmp_path / "notes.txt"
    text.write_text("not a run")
    unrelated = tmp_path / "photos"
    (unrelated / "2024").mkdir(parents=True)
    (unrelated / "2024" / "a.jpg").write_bytes(b"\xff\xd8")
    for path, said in ((text, "is a file but not a checkpoint"), (unrelated, "holds no run")):
        assert TOOL.main([str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {path} {said}") and err.endswith("nothing was changed") and "\n" not in err
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    config = run / ".hydra" / "config.yaml"
    config.write_text("optim:\n  name: seed\n")
    before = config.read_bytes()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(TOOL.OmegaConf, "save", read_only)
    assert TOOL.main([str(run)]) == 1
    out, err = capsys.readouterr()
    assert f"{config}: could not write it (Permission denied): left as it was" in out
    assert "already in today's layout" not in out + err and "could not be written" in err
    assert config.read_bytes() == before
