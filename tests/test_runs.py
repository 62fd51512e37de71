"""The run folder's owner (run_dir.RunDir), the one notion of a model's newest run, and the
atomic writer every output file goes through (files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_write, leftover_temporaries, read_json, write_json
from gru_experiments.runs.run_dir import (
    LAST_CHECKPOINT,
    RunDir,
    find_checkpoint,
    model_name_for,
    model_runs,
    newest_run,
)


def make_run(path: Path, model: str | None = None, status: str | None = None, checkpoint: bool = True,
             mtime: float | None = None, config_model: str | None = None) -> RunDir:
    run = RunDir(path)
    run.path.mkdir(parents=True)
    if checkpoint:
        run.checkpoint_dir.mkdir()
        run.checkpoint.write_bytes(b"ckpt")
    if status:
        run.write_summary({"status": status, "model": model, "checkpoint": str(run.checkpoint)})
    if config_model:
        (run.path / ".hydra").mkdir()
        run.config_file.write_text(f"model:\n  name: {config_model}\n")
    if mtime is not None:
        for file in (run.summary_file, run.checkpoint):
            if file.exists():
                os.utime(file, (mtime, mtime))
    return run


def test_run_dir_knows_its_files(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.summary_file == tmp_path / "run" / "summary.json"
    assert run.samples_file.name == "samples.json" and run.history_file.name == "history.csv"
    assert run.checkpoint == tmp_path / "run" / "checkpoints" / "last.ckpt" == run.path / LAST_CHECKPOINT
    assert run.config_file == tmp_path / "run" / ".hydra" / "config.yaml"
    # Nothing there yet: every reader says so instead of failing.
    assert run.summary() is None and run.samples() is None and run.config() is None
    assert run.last_checkpoint() is None and not run.finished and run.last_written() == 0

    run.write_summary({"status": "failed", "model": "astra_beta"})
    assert run.summary()["model"] == "astra_beta" and not run.finished  # a failed run may be resumed
    run.write_summary({"status": "completed", "model": "astra_beta"})
    assert run.finished and run.model_name() == "astra_beta"
    run.summary_file.write_text("{not json")
    assert run.summary() is None



def test_the_config_record_is_read_back_by_the_run(tmp_path):
    """What the Python API's train() records (Hydra's .hydra/ files) is what the run reads back."""
    from omegaconf import OmegaConf

    run = RunDir(tmp_path / "run")
    record = run.write_config_record(OmegaConf.create({"model": {"name": "astra_beta"}}),
                                     OmegaConf.create({"hydra": {"job": {"num": 0}}}), ["model=astra_beta"])
    assert sorted(p.name for p in record.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert run.config().model.name == "astra_beta" and run.model_name() == "astra_beta"
    assert list(OmegaConf.load(run.path / ".hydra" / "overrides.yaml")) == ["model=astra_beta"]
    # a resume's record is the config the run was last started with
    run.write_config_record(OmegaConf.create({"model": {"name": "astra_beta"}, "trainer": {"max_steps": 9}}),
                            OmegaConf.create({}), ["trainer.max_steps=9"], subdir=".hydra/resumed_2000-01-01")
    assert run.config().trainer.max_steps == 9 and run.config_file.parent.name == "resumed_2000-01-01"


def test_model_name_comes_from_summary_then_config_then_layout(tmp_path):
    assert make_run(tmp_path / "a", "astra_gamma", "completed").model_name() == "astra_gamma"
    assert make_run(tmp_path / "b", config_model="scribe_alpha").model_name() == "scribe_alpha"
    assert make_run(tmp_path / "outputs" / "runs" / "leviathan" / "2000").model_name() == "leviathan"
    assert make_run(tmp_path / "sweep" / "3_astra_beta").model_name() == "astra_beta"
    assert make_run(tmp_path / "somewhere").model_name() is None


def test_of_checkpoint_finds_the_run_a_checkpoint_belongs_to(tmp_path):
    run = make_run(tmp_path / "run", "astra_alpha", "completed")
    assert RunDir.of_checkpoint(run.checkpoint) == RunDir(run.path.resolve())
    loose = tmp_path / "loose" / "model.ckpt"
    loose.parent.mkdir()
    loose.write_bytes(b"x")
    assert RunDir.of_checkpoint(loose) is None
    # A moved run folder: summary.json records the old place; its own checkpoints/ is used.
    moved = make_run(tmp_path / "moved", "astra_alpha", checkpoint=True)
    moved.write_summary({"status": "completed", "model": "astra_alpha",
                         "checkpoint": str(tmp_path / "gone" / "checkpoints" / "last.ckpt")})
    assert moved.last_checkpoint() == moved.checkpoint


def test_newest_run_is_one_notion_for_finished_and_unfinished_runs(tmp_path):
    log_dir = tmp_path / "outputs"
    finished = make_run(log_dir / "runs" / "astra_alpha" / "1", "astra_alpha", "completed", mtime=1_000)
    interrupted = make_run(log_dir / "runs" / "astra_alpha" / "2", mtime=2_000)  # no summary yet
    in_sweep = make_run(log_dir / "multiruns" / "s" / "0_astra_alpha", "astra_alpha", "failed", mtime=1_500)
    make_run(log_dir / "runs" / "astra_alpha" / "3", checkpoint=False)  # stopped before any checkpoint
    make_run(log_dir / "runs" / "astra_beta" / "1", "astra_beta", "completed", mtime=3_000)

    assert model_runs(log_dir, "astra_alpha") == [interrupted, in_sweep, finished]
    assert newest_run(log_dir, "astra_alpha") == interrupted
    assert newest_run(log_dir, "astra_beta").model_name() == "astra_beta"
    assert newest_run(log_dir, "scribe_gamma") is None
    # sample.py's lookup uses the same notion
    assert find_checkpoint("astra_alpha", log_dir) == interrupted.checkpoint
    os.utime(finished.summary_file, (5_000, 5_000))
    assert find_checkpoint("astra_alpha", log_dir) == finished.checkpoint
    assert model_name_for("astra_beta", run=str(in_sweep.path)) == "astra_alpha"


def test_a_sampling_runs_folder_is_named_for_the_model_its_checkpoint_records(tmp_path):
    """model_name_for with a checkpoint outside a run folder: the model its hyper-parameters name, read memory-mapped;
    the configured model where the checkpoint names none or cannot be read (the sampler reports that itself)."""
    import torch

    named, unnamed = tmp_path / "named.ckpt", tmp_path / "unnamed.ckpt"
    torch.save({"hyper_parameters": {"model_name": "leviathan"}, "state_dict": {}}, named)
    torch.save({"hyper_parameters": {}, "state_dict": {}}, unnamed)
    assert model_name_for("astra_alpha", ckpt=str(named)) == "leviathan"
    assert model_name_for("astra_alpha", ckpt=str(unnamed)) == "astra_alpha"
    assert model_name_for("astra_alpha", ckpt=str(tmp_path / "gone.ckpt")) == "astra_alpha"


def test_find_checkpoint_errors(tmp_path):
    with pytest.raises(UserError, match="checkpoint not found"):
        find_checkpoint("astra_alpha", tmp_path, ckpt=str(tmp_path / "nope.ckpt"))
    with pytest.raises(UserError, match="run folder not found"):
        find_checkpoint("astra_alpha", tmp_path, run=str(tmp_path / "nope"))
    empty = make_run(tmp_path / "empty", checkpoint=False)
    with pytest.raises(UserError, match="no checkpoint in"):
        find_checkpoint("astra_alpha", tmp_path, run=str(empty.path))
    with pytest.raises(UserError, match="no trained astra_alpha checkpoint under .*train one with"):
        find_checkpoint("astra_alpha", tmp_path)


def test_atomic_write_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "deep" / "summary.json"
    write_json(target, {"a": 1})
    assert read_json(target) == {"a": 1} and target.read_text().endswith("\n")
    atomic_write(target, b"\x00binary")
    assert target.read_bytes() == b"\x00binary"

    class Boom(Exception):
        pass

    from gru_experiments.files import atomic_file

    with pytest.raises(Boom), atomic_file(target) as f:
        f.write(b"half a file")
        raise Boom
    assert target.read_bytes() == b"\x00binary"  # the old content, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]
    assert leftover_temporaries(target.parent) == []
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert read_json(tmp_path / "bad.json") is None
