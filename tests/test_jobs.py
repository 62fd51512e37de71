"""The failure wrapper (jobs.job): a failing job leaves its failure record, closes its logger
and exits non-zero with one line; a bug keeps its traceback."""

from __future__ import annotations

import json

import pytest

from gru_experiments import jobs
from gru_experiments.errors import UserError
from gru_experiments.jobs import EXIT_USER_ERROR, job
from gru_experiments.loggers import build_logger
from gru_experiments.runs import RunDir
from robustness_helpers import TINY, run_script
from wandb_records import offline_runs



def test_failing_multirun_job_writes_its_record_and_closes_the_wandb_run(compose_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    cfg = compose_config("logger=wandb")
    with pytest.raises(UserError, match="the corpus vanished"), job(cfg, record=True) as current:
        current.logger = build_logger(cfg.logger, cfg)
        current.logger.experiment  # the W&B run starts
        raise UserError("the corpus vanished")
    import wandb

    assert wandb.run is None  # closed: the next job starts its own run
    summary = RunDir(cfg.paths.output_dir).summary()
    assert summary["status"] == "failed" and summary["error"] == "UserError: the corpus vanished"
    assert summary["model"] == "astra_alpha" and "raise UserError" in summary["traceback"]
    (logged,) = offline_runs(cfg.paths.output_dir)
    assert logged.exit_code == 1 and logged.summary["status"] == "failed"


def test_a_single_run_records_nothing_and_a_success_closes_the_logger(compose_config, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_config("logger=wandb")
    with pytest.raises(RuntimeError), job(cfg, record=True):  # not a multirun job: resume= can continue it
        raise RuntimeError("a bug")
    assert RunDir(cfg.paths.output_dir).summary() is None
    with job(cfg, record=True) as current:
        current.logger = build_logger(cfg.logger, cfg)
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
