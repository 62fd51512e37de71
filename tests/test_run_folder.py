"""Issue 62, a run folder belongs to one run: a new training into a folder that holds a run is refused before
anything is written, in one line naming resume=; a refused command leaves the folder byte for byte as it was; the
folder's lock is the folder's own (deleting a file frees nothing, a finished run leaves none); and
benchmarks/gpu_jobs.py resumes the jobs its deadline cut and skips those that finished."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import REPO
from robustness_helpers import error_line, fingerprint, run_script, start_script
from test_resume_inputs import (
    RECIPE,
    STEPS,
    copy_of,
    history_rows,
    interrupted,  # noqa: F401 (a fixture: a run killed after its checkpoint of step 2)
)

from gru_experiments.runs.run_dir import RunDir


@pytest.fixture(scope="module")
def finished(interrupted, tmp_path_factory) -> Path:  # noqa: F811 (the fixture)
    """The interrupted run resumed to its end: a finished run's folder (copy it before changing it)."""
    root, run = copy_of(interrupted, tmp_path_factory.mktemp("finished"))
    result = run_script(root, f"resume={run}")
    assert result.returncode == 0, result.stderr
    return run


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (sha256) and folder under `folder`, by its path relative to it."""
    return {**{str(Path(p).relative_to(folder)): digest for p, digest in fingerprint(folder).items()},
            **{str(p.relative_to(folder)): "folder" for p in folder.rglob("*") if p.is_dir()}}


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
def test_refuse_new_run_names_what_the_folder_holds(tmp_path, left, held, then):
    """RunDir.refuse_new_run without a training (the test above, through train.py, is slow): the one line for each
    run a folder may hold, and nothing in it changed; an empty folder, or one with an empty checkpoints/, is free."""
    from gru_experiments.errors import RunFolderTaken

    run = RunDir(tmp_path / "run")
    (run.path / "checkpoints").mkdir(parents=True)
    run.refuse_new_run()
    for name, text in left.items():
        (run.path / name).parent.mkdir(parents=True, exist_ok=True)
        (run.path / name).write_text(text)
    before = snapshot(run.path)
    with pytest.raises(RunFolderTaken, match="^" + re.escape(
            f"{run.path} holds {held}, and a run folder holds one run: {then.format(run=run.path)}; a new run goes "
            "in a folder of its own (leave hydra.run.dir out, or name a new folder)") + "$"):
        run.refuse_new_run()
    assert snapshot(run.path) == before


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


# --- benchmarks/gpu_jobs.py ---------------------------------------------------------------------------------------

class Clock:
    """gpu_jobs.py's clock: 0 s until `due()` (a file exists, a run is over), then past any deadline; short sleeps."""

    def __init__(self, due):
        self.due = due

    def monotonic(self) -> float:
        return 1e9 if self.due() else 0.0

    @staticmethod
    def sleep(seconds: float) -> None:
        import time

        time.sleep(min(seconds, 0.2))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_gpu_jobs_resumes_the_job_its_deadline_cut_and_skips_it_once_finished(tiny_corpus, data_dir, tmp_path,
                                                                               monkeypatch, capsys):
    """Run twice with the same flags, gpu_jobs.py restarted every job in its folder: a job its deadline had cut lost
    its last.ckpt and its log. Now the second call resumes it from that last.ckpt (its log and first .hydra/ kept)
    and a third skips it, finished, its folder byte for byte as it was."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_jobs

    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    argv = ["--only", "lr", "--jobs", "1", "--accelerator", "cpu", "--steps", "200", "--root", str(tmp_path),
            "preset=smoke", f"data.path={tiny_corpus}", "data.train_fraction=0.9", f"paths.data_dir={data_dir}",
            "model.epochs=1", "model.steps_per_epoch=200", "checkpoint.every_n_steps=5"]
    first, second = (tmp_path / "lr_min" / name for name in ("00_mingru_lr1e-3", "01_mingru_lr2e-3"))
    checkpoint = first / "checkpoints" / "last.ckpt"
    monkeypatch.setattr(gpu_jobs, "time", Clock(checkpoint.exists))  # the deadline: right after its first checkpoint
    gpu_jobs.main(argv)
    assert checkpoint.is_file() and not (first / "summary.json").exists()
    import torch

    cut_at = torch.load(checkpoint, weights_only=True, mmap=True)["global_step"]
    record = {name: sha256(first / ".hydra" / name) for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    log = (first / "train.log").read_bytes()
    capsys.readouterr()

    monkeypatch.setattr(gpu_jobs, "time", Clock((first / "samples.json").exists))  # written last
    gpu_jobs.main(argv)
    summary = json.loads((first / "summary.json").read_text())
    assert (summary["status"], summary["resumed_from_step"], summary["train_steps"]) == ("completed", cut_at, 200)
    assert {name: sha256(first / ".hydra" / name) for name in record} == record
    assert (first / "train.log").read_bytes().startswith(log)
    assert "mingru_lr1e-3: resumed from its last.ckpt" in capsys.readouterr().out

    before = snapshot(first)
    monkeypatch.setattr(gpu_jobs, "time", Clock(second.exists))  # the deadline once the next job has started
    assert not second.exists()
    gpu_jobs.main(argv)
    assert snapshot(first) == before
    out = capsys.readouterr().out
    assert "mingru_lr1e-3: finished (completed): skipped" in out and "| mingru_lr1e-3 | completed |" in out


def test_gpu_jobs_moves_aside_a_job_cut_before_its_first_checkpoint_but_never_one_in_use(tmp_path):
    """A job cut before its first checkpoint holds a run with nothing to resume: gpu_jobs.py moves its folder to
    <root>/cut/<group>/ (nothing deleted) so that the job can start again; a folder another process holds stays."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_jobs

    job = gpu_jobs.lr_jobs(tmp_path)[0]
    (job.folder / ".hydra").mkdir(parents=True)
    (job.folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (job.folder / "train.log").write_text("the cut part's log\n")
    before = snapshot(job.folder)
    with RunDir(job.folder).hold():
        assert not gpu_jobs.move_aside(job) and job.status == "in use"
    assert snapshot(job.folder) == before
    assert gpu_jobs.move_aside(job) and not job.folder.exists()
    [aside] = (tmp_path / "cut" / "lr_min").iterdir()
    assert aside.name.startswith(job.folder.name + "_") and snapshot(aside) == before
    job.folder.mkdir()
    (job.folder / "summary.json").write_text('{"status": "completed"}')
    assert gpu_jobs.start(job, [], [], {}) is None and job.status == "completed" and job.process is None
