"""The run folder (runs/run_dir.py): RunDir knows its files and its model, and a model's newest run is one notion
(sample.py's lookup among them). A run folder belongs to one run (issue 62): a new training into a folder that holds a
run is refused before anything is written, in one line naming resume=; a refused command leaves the folder byte for
byte as it was; the folder's lock is the folder's own (deleting a file frees nothing, a finished run leaves none)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from robustness_helpers import error_line, run_script, snapshot, start_script
from test_resume_inputs import (
    RECIPE,
    STEPS,
    copy_of,
    history_rows,
    interrupted,  # noqa: F401 (a fixture: a run killed after its checkpoint of step 2)
)

from gru_experiments.errors import UserError
from gru_experiments.runs.run_dir import (
    LAST_CHECKPOINT,
    RunDir,
    find_checkpoint,
    model_name_for,
    model_runs,
    newest_run,
)

# --- RunDir: its files, its model, the newest run ---------------------------------------------------------------------

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
    interrupted = make_run(log_dir / "runs" / "astra_alpha" / "2", mtime=2_000)  # no summary yet  # noqa: F811 (not the fixture)
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


# --- a run folder belongs to one run (issue 62) -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(interrupted, tmp_path_factory) -> Path:  # noqa: F811 (the fixture)
    """The interrupted run resumed to its end: a finished run's folder (copy it before changing it)."""
    root, run = copy_of(interrupted, tmp_path_factory.mktemp("finished"))
    result = run_script(root, f"resume={run}")
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.slow
def test_a_new_run_into_a_folder_that_holds_a_run_is_refused_and_changes_nothing(interrupted, finished, tmp_path,  # noqa: F811 (the fixture)
                                                                                  tiny_corpus):
    """`train.py hydra.run.dir=RUN` where RUN holds a run (cut at step 2, or finished) once trained a new run in it:
    its last.ckpt, .hydra/ and summary.json replaced, history.csv appended to. Now: one line naming resume=, every
    file as it was."""
    for name, run in (("cut", interrupted), ("finished", finished)):
        root, copy = copy_of(run, tmp_path / name)
        before = snapshot(copy)
        result = run_script(root, *RECIPE, f"data.path={tiny_corpus}", "model.lr=0.02", f"hydra.run.dir={copy}")
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        line = error_line(result.stderr)
        assert f"{copy} holds a" in line and "resume=" in line, line
        assert (f"python train.py resume={copy}" in line) == (name == "cut"), line
        assert snapshot(copy) == before


@pytest.mark.parametrize("left, held, then", [
    ({".hydra/config.yaml": "seed: 1"}, "a run that stopped before its first checkpoint",
     "it has no checkpoint to resume= from"),
    ({"checkpoints/last.ckpt": "", "history.csv": ""}, "a run that did not finish (its checkpoints/last.ckpt)",
     "continue it with: python train.py resume={run}"),
    ({"checkpoints/last.ckpt": "", "summary.json": '{"status": "completed"}'}, "a finished run (its summary.json)",
     "resume= continues only a run that did not finish"),
])
def test_claim_names_what_the_folder_holds(tmp_path, left, held, then):
    """RunDir.claim without a training (the test above, through train.py, is slow): the one line for each run a
    folder may hold, and nothing in it changed; an empty folder, or one with an empty checkpoints/, is free."""
    from gru_experiments.errors import RunFolderTaken

    run = RunDir(tmp_path / "run")
    (run.path / "checkpoints").mkdir(parents=True)
    with run.claim():
        pass
    for name, text in left.items():
        (run.path / name).parent.mkdir(parents=True, exist_ok=True)
        (run.path / name).write_text(text)
    before = snapshot(run.path)
    with pytest.raises(RunFolderTaken, match="^" + re.escape(
            f"{run.path} holds {held}, and a run folder holds one run: {then.format(run=run.path)}; a new run goes "
            "in a folder of its own (leave hydra.run.dir out, or name a new folder)") + "$"):
        with run.claim():
            pass
    assert snapshot(run.path) == before


def test_claim_holds_a_new_runs_folder_and_refuses_one_taken_or_inside_a_run(tmp_path):
    """RunDir.claim, train()'s one call for a new run's folder: a free folder is created and held (a second claim is
    refused while the first holds it, and free after); one holding a run is refused unchanged; a folder inside a
    run's is refused before anything is created in that run."""
    from gru_experiments.errors import RunFolderTaken

    fresh = RunDir(tmp_path / "fresh")
    with fresh.claim() as held:
        assert held is fresh and fresh.path.is_dir()
        with pytest.raises(RunFolderTaken, match="is in use"):
            with RunDir(fresh.path).claim():
                pass
    with fresh.claim():  # released
        pass
    taken = RunDir(tmp_path / "taken")
    taken.checkpoint_dir.mkdir(parents=True)
    taken.checkpoint.write_text("")
    before = snapshot(taken.path)
    with pytest.raises(RunFolderTaken, match="a run that did not finish"):
        with taken.claim():
            pass
    inner = RunDir(taken.checkpoint_dir / "mine")
    with pytest.raises(RunFolderTaken, match=re.escape(f"is inside the folder of a run ({taken.path})")):
        with inner.claim():
            pass
    assert not inner.path.exists() and snapshot(taken.path) == before


@pytest.mark.slow
def test_a_command_refused_for_a_folder_in_use_leaves_it_byte_for_byte(interrupted, tmp_path, tiny_corpus):  # noqa: F811 (the fixture)
    """A command refused because another process trains in the folder had already rewritten .hydra/*.yaml with its
    own config (Hydra wrote them before the lock was checked). Now nothing is written before the folder is its own:
    neither into a held run nor into a held empty folder (a run that has just started)."""
    root, copy = copy_of(interrupted, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (copy, empty):
        before = snapshot(folder)
        with RunDir(folder).hold():  # as a train.py that trains in it holds it
            result = run_script(root, *RECIPE, f"data.path={tiny_corpus}", "model.lr=0.02", f"hydra.run.dir={folder}")
        assert result.returncode == 2, result.stderr[-2000:]
        assert "is in use" in error_line(result.stderr) or folder == copy and "holds a run" in result.stderr
        assert snapshot(folder) == before


@pytest.mark.slow
def test_deleting_the_lock_file_lets_no_second_process_in(interrupted, tmp_path):  # noqa: F811 (the fixture)
    """Deleting .run.lock once let a second resume train the folder beside the first (history.csv: every row
    twice). The lock is the folder's own: the second is refused while the first runs (stopped here right after it
    took the folder), and the finished run leaves no lock file behind."""
    root, run = copy_of(interrupted, tmp_path)
    first = start_script(root, f"resume={run}", PYTHONUNBUFFERED=1)
    for line in first.stdout:  # "resuming RUN from ...": printed once the folder is held
        if line.startswith("resuming "):
            break
    first.send_signal(signal.SIGSTOP)
    try:
        Path(run / ".run.lock").unlink(missing_ok=True)
        second = run_script(root, f"resume={run}")
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert second.returncode == 2 and "is in use" in error_line(second.stderr), second.stderr[-2000:]
    rows = history_rows(run)
    assert len(rows) == len(set(rows)), rows  # no figure written twice
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["train_steps"], summary["resumed_from_step"]) == (STEPS, 2)
    assert not (run / ".run.lock").exists()


@pytest.mark.slow
def test_a_lock_file_that_is_a_folder_or_a_dangling_link_stops_nothing(interrupted, tmp_path):  # noqa: F811 (the fixture)
    """A .run.lock that is a folder, or a link to nothing, made every train.py in the run folder end in a traceback
    (IsADirectoryError, ELOOP). The lock is the folder itself: the resume runs."""
    for kind in ("folder", "link"):
        root, run = copy_of(interrupted, tmp_path / kind)
        lock = run / ".run.lock"
        lock.unlink(missing_ok=True)  # the file an older version left
        lock.mkdir() if kind == "folder" else lock.symlink_to(tmp_path / "gone" / "lock")
        result = run_script(root, f"resume={run}")
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["status"], summary["train_steps"]) == ("completed", STEPS)  # resumed to its end


def test_where_a_folder_cannot_be_locked_a_lock_file_does_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    """Where the file system cannot lock a folder (NFS, no fcntl): .run.lock instead; one that is a folder or a
    dangling link is a UserError in one line, and one that another process holds refuses the folder."""
    from gru_experiments.errors import RunFolderTaken, UserError
    from gru_experiments.runs import folder_lock

    monkeypatch.setattr(folder_lock, "_lock_directory", lambda path, in_use: None)
    with RunDir(tmp_path / "ok").hold():
        with pytest.raises(RunFolderTaken, match="is in use: another process is training in it"):
            with RunDir(tmp_path / "ok").hold():
                pass
    for kind in ("folder", "link"):
        run = tmp_path / kind
        run.mkdir()
        lock = run / ".run.lock"
        lock.mkdir() if kind == "folder" else lock.symlink_to(tmp_path / "gone" / "lock")
        with pytest.raises(UserError, match=rf"cannot lock {run}: {lock} .* remove it") as refused:
            with RunDir(run).hold():
                pass
        assert "\n" not in str(refused.value)


def test_a_folder_held_by_an_older_version_through_its_lock_file_is_in_use(tmp_path):
    """A train.py from before the folder's own lock holds .run.lock: that counts as in use too."""
    from filelock import FileLock

    from gru_experiments.errors import RunFolderTaken

    held = FileLock(str(tmp_path / ".run.lock"), timeout=0)
    with held:
        with pytest.raises(RunFolderTaken, match="is in use"):
            with RunDir(tmp_path).hold():
                pass
    with RunDir(tmp_path).hold():  # released: free
        pass
