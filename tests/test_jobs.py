"""The failure wrapper (jobs.job): a failing job leaves its failure record, closes its logger
and exits non-zero with one line; a bug keeps its traceback. Through train.py: a bad value is one line (exit
status 2) and damages nothing, an unknown config name gets Hydra's own message, debug=true shows the traceback, and
a multirun's failing jobs get a line each."""

from __future__ import annotations

import errno
import io
import json

import pytest
import torch
from omegaconf import OmegaConf
from robustness_helpers import TINY, assert_untouched, error_line, fingerprint, run_script
from wandb_records import offline_runs

from gru_experiments.errors import UserError
from gru_experiments.runs import jobs
from gru_experiments.runs.jobs import EXIT_USER_ERROR, job
from gru_experiments.runs.loggers import build_logger
from gru_experiments.runs.run_dir import RunDir


def logger_of(cfg):
    """The logger train() builds of its RunSpec: the logger group's settings and the resolved config."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    return build_logger(plain["logger"], plain)


def test_failing_multirun_job_writes_its_record_and_closes_the_wandb_run(compose_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    cfg = compose_config("logger=wandb")
    with pytest.raises(UserError, match="the corpus vanished"), job(cfg, record=True) as current:
        current.logger = logger_of(cfg)
        current.logger.experiment  # the W&B run starts
        raise UserError("the corpus vanished")
    import wandb

    assert wandb.run is None  # closed: the next job starts its own run
    summary = RunDir(cfg.paths.output_dir).summary()
    assert summary["status"] == "failed" and summary["error"] == "UserError: the corpus vanished"
    assert summary["model"] == "astra_alpha" and "raise UserError" in summary["traceback"]
    (logged,) = offline_runs(cfg.paths.output_dir)
    assert logged.exit_code == 1 and logged.summary["status"] == "failed"


@pytest.mark.parametrize("overrides, family", [
    (["model=astra_alpha"], "gru"), (["model=lstm"], "lstm"), (["model=mlp"], "mlp"), (["model=ngram"], "ngram"),
    (["model=transformer"], "transformer"),
    (["model=astra_alpha", "model.architecture.cell=tanh"], None),  # the failure may be the architecture's own
])
def test_a_failure_record_names_the_family(compose_config, monkeypatch, overrides, family):
    """summary.json's "family" (as a finished run's), from the architecture's class; None when the
    architecture does not build (bookkeeping never hides the error)."""
    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    cfg = compose_config(*overrides)
    with pytest.raises(UserError, match="boom"), job(cfg, record=True):
        raise UserError("boom")
    summary = RunDir(cfg.paths.output_dir).summary()
    assert summary["status"] == "failed" and summary["family"] == family and "cell" not in summary


def test_a_single_run_records_nothing_and_a_success_closes_the_logger(compose_config, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_config("logger=wandb")
    with pytest.raises(RuntimeError), job(cfg, record=True):  # not a multirun job: resume= can continue it
        raise RuntimeError("a bug")
    assert RunDir(cfg.paths.output_dir).summary() is None
    with job(cfg, record=True) as current:
        current.logger = logger_of(cfg)
        current.logger.experiment
    import wandb

    assert wandb.run is None
    (logged,) = offline_runs(cfg.paths.output_dir)
    assert logged.exit_code == 0


def test_reported_user_error_is_one_line_and_exit_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info, job({"debug": False}, report=True):
        raise UserError("data.path: no such\nfile")
    assert exit_info.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err == "error: data.path: no such file\n"
    # A bug is not a user error: it keeps its traceback (re-raised), whatever report says.
    with pytest.raises(ZeroDivisionError), job(report=True):
        1 / 0


def test_a_failed_job_without_its_logger_builds_one_to_hold_its_record(compose_config, monkeypatch):
    """A multirun job that failed before train() built its logger: record_failure builds the config's own (csv here)
    and hands it back, so that job() closes it."""
    from lightning.pytorch.loggers import CSVLogger

    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    cfg = compose_config("logger=csv")
    with pytest.raises(UserError, match="no corpus"), job(cfg, record=True) as current:
        raise UserError("no corpus")
    assert isinstance(current.logger, CSVLogger) and current.logger.save_dir == cfg.paths.output_dir
    assert RunDir(cfg.paths.output_dir).summary()["error"] == "UserError: no corpus"


def hydra_job(monkeypatch, output_dir, mode=None):
    """A stand-in for Hydra's config of a running job (number 3, named train, in `output_dir`)."""
    from types import SimpleNamespace

    from hydra.types import RunMode

    running = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(output_dir)), mode=mode or RunMode.RUN,
                              job=SimpleNamespace(name="train", num=3))
    monkeypatch.setattr(jobs, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: running))


def test_a_multirun_jobs_user_error_fails_the_job_in_one_line_naming_it(monkeypatch, capsys):
    from hydra.types import RunMode

    hydra_job(monkeypatch, "unused", RunMode.MULTIRUN)
    with pytest.raises(jobs.JobFailed, match=r"^error: multirun job 3 failed: data.path: no such file$"), \
            job({"debug": False}, report=True):
        raise UserError("data.path: no such\nfile")
    assert capsys.readouterr().err == "error: data.path: no such file\n"


def test_only_a_run_folder_with_nothing_but_hydras_record_is_discarded(monkeypatch, tmp_path):
    """discard_untouched_run_dir after an input error: .hydra/ with Hydra's three files and an empty log go, and the
    folders left empty above them up to the log folder; a folder with anything else of its own stays whole."""
    log_dir, run = tmp_path / "outputs", tmp_path / "outputs" / "runs" / "astra_alpha" / "2000"
    hydra_job(monkeypatch, run)

    def start(*extra: tuple[str, str]) -> dict:
        for name, text in (("train.log", ""), (".hydra/config.yaml", "seed: 1"), (".hydra/hydra.yaml", "{}"), *extra):
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_text(text)
        return fingerprint(run)

    for extra in (("history.csv", "step\n"), ("train.log", "training\n"), (".hydra/notes.txt", "mine")):
        before = start(extra)
        assert not jobs.discard_untouched_run_dir(log_dir)
        assert fingerprint(run) == before
        (run / extra[0]).unlink() if extra[0] != "train.log" else (run / extra[0]).write_text("")
    assert jobs.discard_untouched_run_dir(log_dir)
    assert not run.exists() and list(log_dir.iterdir()) == []

@pytest.mark.slow
def test_failing_train_py_job_in_a_multirun(tiny_corpus, tmp_path):
    """A real multirun: the failing job's record is in its folder, the process exits non-zero,
    and the error is one line (no traceback)."""
    sweep = tmp_path / "sweep"
    result = run_script(tmp_path, "-m", *TINY, f"data.path={tiny_corpus}", "trainer.max_steps=1",
                        "model.steps_per_epoch=1", "tokenizer=spm", "tokenizer.vocab_size=100000",
                        f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors and all("vocab" in line.lower() for line in errors), result.stderr
    summary = json.loads((sweep / "0_astra_alpha" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["model"] == "astra_alpha"


# --- A full disk: one line, the last good checkpoint and the resume= command (docs/robustness.md) ---

def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fill_the_disk(monkeypatch):
    """torch.save's writes fail as on a full disk (torch then raises its own RuntimeError, the
    OSError as its context, as on a real full filesystem)."""
    real_save = torch.save

    class FullDisk(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            _no_space()

    monkeypatch.setattr(torch, "save", lambda obj, f, *args, **kwargs: real_save(obj, FullDisk(), *args, **kwargs))


def test_full_disk_during_a_checkpoint_is_one_line_with_the_resume_command(compose_config, monkeypatch, capsys):
    from gru_experiments.runs.checkpoints import atomic_torch_save

    cfg = compose_config()
    run = RunDir(cfg.paths.output_dir)
    atomic_torch_save({"global_step": 100, "state_dict": {}}, run.checkpoint)  # the last good one
    good = run.checkpoint.read_bytes()
    _fill_the_disk(monkeypatch)
    with pytest.raises(SystemExit) as exit_info, job(cfg, report=True):
        atomic_torch_save({"global_step": 200, "state_dict": {"w": torch.zeros(3)}}, run.checkpoint)
    assert exit_info.value.code == jobs.EXIT_DISK_FULL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == (f"error: no space left on device: could not write {run.checkpoint}; the last good checkpoint "
                   f"is {run.checkpoint} (step 100); free some space, then resume with: "
                   f"python train.py resume={run.path}\n")
    assert run.checkpoint.read_bytes() == good  # intact, and no temporary file left
    assert sorted(p.name for p in run.checkpoint_dir.iterdir()) == ["last.ckpt"]


def test_full_disk_without_a_checkpoint_sample_or_sweep_is_one_line(monkeypatch, capsys, tmp_path):
    """sweep.py and sample.py (no checkpoint of their own): the file, and run the command again."""
    from gru_experiments import files

    monkeypatch.setattr(files.os, "fsync", _no_space)
    with pytest.raises(SystemExit) as exit_info, job(argv=["sweep.py"], report=True):
        files.write_json(tmp_path / "report" / "results.json", {"a": 1})
    assert exit_info.value.code == jobs.EXIT_DISK_FULL
    assert capsys.readouterr().err == (f"error: no space left on device: could not write {tmp_path}/report/"
                                       "results.json; free some space, then run the same command again\n")
    assert list((tmp_path / "report").iterdir()) == []  # no temporary file left
    with pytest.raises(OSError), job(argv=["sweep.py", "debug=true"], report=True):  # debug: the traceback
        files.write_json(tmp_path / "report" / "results.json", {"a": 1})


def _can_mount_tmpfs(path) -> bool:
    import os
    import subprocess

    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_run_on_a_filesystem_too_small_for_two_checkpoints_stops_with_one_line_then_resumes(
        tiny_corpus, tmp_path):
    """The real thing (as root, where tmpfs can be mounted; docs/robustness.md has the manual check):
    1.5 MB holds one Astra-alpha checkpoint (~1.1 MB) but not a second beside it."""
    import subprocess

    disk = tmp_path / "disk"
    if not _can_mount_tmpfs(disk):
        pytest.skip("needs root to mount a tmpfs (test_full_disk_during_a_checkpoint_... covers the message)")
    try:
        run_dir = disk / "run"
        settings = [*TINY, f"data.path={tiny_corpus}", "trainer.max_steps=6", "checkpoint.every_n_steps=3",
                    "model.steps_per_epoch=100", f"hydra.run.dir={run_dir}", f"paths.data_dir={tmp_path / 'data'}"]
        result = run_script(tmp_path, *settings)
        assert result.returncode == jobs.EXIT_DISK_FULL, result.stderr
        assert "Traceback" not in result.stderr
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert line == (f"error: no space left on device: could not write {run_dir}/checkpoints/last.ckpt; the "
                        f"last good checkpoint is {run_dir}/checkpoints/last.ckpt (step 3); free some space, "
                        f"then resume with: python train.py resume={run_dir}")
        assert result.stderr.strip().endswith(line)
        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)
        resumed = run_script(tmp_path, f"resume={run_dir}")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads((run_dir / "summary.json").read_text())["train_steps"] == 6
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_home_path_is_expanded_and_a_value_beyond_ascii_gets_a_hint():
    """Issue 72: data.path=~/x.txt (docs/sweeps.md's own example) and prompt=☃ ended in Hydra's
    LexerNoViableAltException, the latter with no word of quoting."""
    import os

    from gru_experiments.errors import UserError
    from gru_experiments.runs.jobs import command_line

    home = os.path.expanduser("~")
    assert command_line(["train.py", "data.path=~/x.txt", "-m", "data.path=~/a.txt,~/b.txt", "prompt='~/q'"]) == [
        "train.py", f"data.path={home}/x.txt", "-m", f"data.path={home}/a.txt,{home}/b.txt", "prompt='~/q'"]
    with pytest.raises(UserError) as refused:
        command_line(["sample.py", "prompt=☃"])
    assert str(refused.value) == ("prompt=☃: Hydra's command line takes a value with characters beyond ASCII only "
                                  "quoted: prompt='☃' (in a shell: \"prompt='☃'\")")
    assert command_line(["sample.py", "prompt='☃'", "prompt=plain"]) == ["sample.py", "prompt='☃'", "prompt=plain"]


@pytest.mark.slow
def test_train_py_bad_value_one_line_exit_2_nothing_damaged(workspace, tiny_corpus):
    before = fingerprint(workspace)
    result = run_script(workspace, f"data.path={tiny_corpus}", *TINY, "model.lr=-1")
    assert result.returncode == 2
    assert error_line(result.stderr) == "error: invalid model.lr=-1: must be a number > 0"
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert_untouched(before, fingerprint(workspace))


def test_train_py_unknown_names_get_hydras_message(workspace):
    before = fingerprint(workspace)
    for override, message in [("model=astra_delta", "Could not find 'model/astra_delta'"),
                              ("tokenizer=bpe", "Could not find 'tokenizer/bpe'"),
                              ("logger=neptune", "Could not find 'logger/neptune'")]:
        result = run_script(workspace, override)
        assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert_untouched(before, fingerprint(workspace))


def test_debug_re_raises_instead_of_exiting(monkeypatch):
    for cfg, env in [({"debug": True}, None), ({"debug": False}, "1")]:
        if env:
            monkeypatch.setenv("HYDRA_FULL_ERROR", env)
        with pytest.raises(UserError, match="bad"), job(cfg, report=True):
            raise UserError("bad")
    with pytest.raises(UserError), job(argv=["train.py", "debug=true"], report=True):
        raise UserError("bad")


@pytest.mark.slow
def test_train_py_debug_shows_the_traceback(workspace):
    result = run_script(workspace, "model.lr=-1", "debug=true")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "InvalidSetting: invalid model.lr=-1" in result.stderr


@pytest.mark.slow
def test_multirun_job_errors_fail_the_sweep_with_one_line_each(workspace, tiny_corpus):
    result = run_script(workspace, "-m", f"data.path={tiny_corpus}", *TINY, "model.lr=-1,-2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines[:2] == ["error: invalid model.lr=-1: must be a number > 0",
                         "error: invalid model.lr=-2: must be a number > 0"]
    assert lines[-1] == "error: multirun job 0 failed: invalid model.lr=-1: must be a number > 0"
