"""benchmarks/gpu_study.sh end to end on the CPU at a tiny step count (ACCELERATOR=cpu): each model trained,
its figures printed from its summary.json, the exit status the number of models that did not complete; and the
scale study's experiments (python sweep.py experiments=scale), each its model's recipe cut to 2,000 steps; and
benchmarks/gpu_jobs.py: its jobs and refusals, and the next call after a deadline, which resumes the jobs it cut
(or moves aside one cut before its first checkpoint) and skips those that finished."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONF, REPO
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from robustness_helpers import snapshot
from test_resume_inputs import (
    interrupted,  # noqa: F401 (a fixture: a run killed after its checkpoint of step 2)
)

import sweep as sweep_script
from gru_experiments.runs.run_dir import RunDir


@pytest.mark.slow
def test_gpu_study_runs_end_to_end_on_the_cpu(tiny_corpus, data_dir, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ACCELERATOR": "cpu",
           "STEPS": "2", "LOG_DIR": str(tmp_path / "outputs"), "PROJECT_ROOT": str(REPO),
           "OVERRIDES": f"preset=smoke data.path={tiny_corpus} paths.data_dir={data_dir} evaluation.text.samples=0"}
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_study.sh"), "astra_alpha", "astra_beta"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for model in ("astra_alpha", "astra_beta"):
        assert f"gpu_study.sh: {model} completed by " in result.stdout
        [summary] = (tmp_path / "outputs" / "runs" / model).glob("*/summary.json")
        assert str(summary) in result.stdout
    assert result.stdout.count("  train_steps: 2\n") == 2
    assert result.stdout.count("  tokens_per_second: ") == 2 and result.stdout.count("  stateful_bpc: ") == 2


def test_gpu_study_counts_a_model_that_fails(data_dir, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ACCELERATOR": "cpu",
           "LOG_DIR": str(tmp_path / "outputs"), "PROJECT_ROOT": str(REPO)}
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_study.sh"), "no_such_model"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "gpu_study.sh: no_such_model wrote no summary.json" in result.stderr


def test_gpu_study_stopped_while_a_run_starts_says_so_in_one_line(data_dir, tmp_path):
    """SECONDS_PER_MODEL=1: timeout's SIGINT reaches train.py during its imports or Hydra's start (issue 53: a
    KeyboardInterrupt traceback per model); each gets one line instead."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ACCELERATOR": "cpu",
           "STEPS": "3", "SECONDS_PER_MODEL": "1", "LOG_DIR": str(tmp_path / "outputs"), "PROJECT_ROOT": str(REPO)}
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_study.sh"), "astra_alpha", "mingru"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.stderr.count("train.py: interrupted (SIGINT) while starting, before training began") == 2


@pytest.mark.parametrize("experiment, recipe_steps", [("scale_astra_alpha", 2000), ("scale_astra_gamma", 8000),
                                                      ("scale_scribe_beta", 3750)])
def test_the_scale_study_cuts_each_recipe_to_2000_steps(experiment, recipe_steps):
    settings, _ = sweep_script.parse_arguments(["experiments=scale"])
    assert experiment in settings.experiments and len(settings.experiments) == 5
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
    base = experiment.removeprefix("scale_")
    assert cfg.model.name == base and cfg.trainer.max_steps == 2000
    assert cfg.model.epochs * cfg.model.steps_per_epoch == recipe_steps
    assert cfg.tokenizer.kind == ("spm" if base.startswith("scribe") else "char")
    own = OmegaConf.load(CONF / "model" / f"{base}.yaml")
    assert cfg.model.lr == (own.model.lr if "model" in own else own.lr)  # its own learning rate


def test_gpu_jobs_plans_the_rungs_sweep_and_picks_each_familys_best_rate(tmp_path):
    """benchmarks/gpu_jobs.py: every minimal family at every rate, each recall experiment beside its twin, and
    the recall runs of a family at the rate of its best completed run (stateful bits per character)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_jobs

    lr = gpu_jobs.lr_jobs(tmp_path)
    assert gpu_jobs.TUNED == ("mingru", "minlstm", "lstm")  # the LSTM tuned as minGRU and minLSTM are
    assert [(job.family, job.overrides[1]) for job in lr] == [
        (m, f"model.lr={r}") for m in gpu_jobs.TUNED for r in gpu_jobs.RATES]
    assert [job.folder.name for job in gpu_jobs.lr_jobs(tmp_path, ("lstm",))][:1] == ["12_lstm_lr1e-3"]
    pairs = gpu_jobs.recall_jobs(tmp_path, gpu_jobs.GRU_RECALL, 0)
    assert [job.overrides[:2] for job in pairs[:2]] == [["experiment=recall_beta_windows", "probe=recall"],
                                                        ["experiment=recall_beta_windows", "probe=none"]]
    tuned = {experiment for experiments in gpu_jobs.TUNED_RECALL.values() for experiment in experiments}
    assert set(gpu_jobs.GRU_RECALL) | tuned | set(gpu_jobs.LSTM_BETA_RECALL) \
        == set(OmegaConf.load(CONF / "sweep.yaml").experiment_sets.recall_horizon)
    for job, (bpc, status) in zip(lr, [(2.5, "completed"), (2.4, "completed"), (2.1, "failed")]):
        job.folder.mkdir(parents=True)
        (job.folder / "summary.json").write_text(f'{{"status": "{status}", "stateful_bpc": {bpc}}}')
    assert gpu_jobs.best_rate(lr, "mingru") == gpu_jobs.RATES[1]  # the failed run's figure does not count
    assert gpu_jobs.best_rate(lr, "minlstm") is None

def test_the_code_corpus_set_runs_each_model_as_on_tiny_shakespeare_on_data_pystdlib():
    settings, _ = sweep_script.parse_arguments(["experiments=code_corpus"])
    assert settings.experiments == ["code_astra_alpha", "code_astra_beta", "code_transformer"]
    for experiment in settings.experiments:
        model = experiment.removeprefix("code_")
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
            plain = compose(config_name="train", overrides=[f"model={model}"])
        assert cfg.data.sha256 == OmegaConf.load(CONF / "data" / "pystdlib.yaml").sha256 != plain.data.sha256
        cfg.data = plain.data  # everything else (the model, its recipe, learning rate, steps, evaluation) unchanged
        assert OmegaConf.to_container(cfg) == OmegaConf.to_container(plain)


def test_gpu_jobs_refuses_no_steps_and_no_jobs_in_one_line():
    """--steps 0 once meant no step limit (the recipes' own: hours); --jobs 0 would start nothing and wait."""
    for flag in ("--steps", "--jobs"):
        for value in ("0", "-2"):
            done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_jobs.py"), flag, value],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 2 and done.stdout == ""
            assert done.stderr.strip().splitlines() == [done.stderr.strip()]
            assert done.stderr.startswith(f"gpu_jobs.py: {flag} {value}: must be an integer >= 1")


@pytest.mark.slow
def test_gpu_jobs_runs_the_lstms_tuning_then_its_recall_pairs_on_a_cpu(small_shakespeare, data_dir, tmp_path):
    """--only lstm --accelerator cpu --steps 2: the LSTM at every rate, then its α pairs at the best rate and its β
    pairs (the plumbing; a 2-step run's figures mean nothing)."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_jobs.py"), "--only", "lstm", "--accelerator",
                           "cpu", "--steps", "2", "--jobs", "2", "--root", str(tmp_path), "preset=smoke",
                           f"data.path={small_shakespeare}", "data.train_fraction=0.8", f"paths.data_dir={data_dir}",
                           "evaluation.text.samples=0"],
                          env={**os.environ, "PROJECT_ROOT": str(REPO)}, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "lstm: best rate " in done.stdout and "its recall pairs start" in done.stdout
    ran = sorted(path.parent.name for path in tmp_path.rglob("summary.json"))
    assert ran == sorted([f"{12 + i:02d}_lstm_lr{rate}" for i, rate in enumerate(("1e-3", "2e-3", "3e-3", "5e-3",
                                                                                      "1e-2", "2e-2"))]
                         + [f"{n:02d}_recall_lstm_{size}_{mode}_{probe}" for n, (size, mode, probe) in
                            enumerate([(s, m, p) for s in ("beta",) for m in ("windows", "streams")
                                       for p in ("recall", "none")], 12)]
                         + [f"{n:02d}_recall_lstm_alpha_{mode}_{probe}" for n, (mode, probe) in
                            enumerate([(m, p) for m in ("windows", "streams") for p in ("recall", "none")], 28)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu_check.sh would run in full")
def test_gpu_check_on_a_machine_without_cuda_says_so_in_one_line(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OUT": str(tmp_path)}
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == ("gpu_check.sh: no CUDA device (torch.cuda.is_available() is False): this "
                                     "script is for a GPU")


def test_gpu_jobs_refuses_an_unknown_accelerator_or_a_missing_gpu_before_any_job(tmp_path, capsys, monkeypatch):
    """As gpu_study.sh does: one line, exit status 2, no job folder (this CPU build of torch sees no GPU)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu_jobs

    assert gpu_jobs.main(["--accelerator", "banana", "--root", str(tmp_path)]) == 2
    assert "--accelerator banana: not an accelerator: give one of gpu, cuda, cpu, auto" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gpu_jobs.main(["--root", str(tmp_path)]) == 2
        assert "--accelerator gpu: no CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_gpu_jobs_checks_its_deadline_root_and_overrides_before_any_job(tmp_path, capsys, monkeypatch):
    """--deadline 0 (or -5) ran nothing and listed every job "not run"; --root FILE was a traceback; a bad override
    (model.lr=-1, +colour=red) started every job, each failing. Now one line each, exit status 2, no job started."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu_jobs

    monkeypatch.setattr(gpu_jobs.subprocess, "Popen", lambda *a, **k: pytest.fail("a job started"))
    text = tmp_path / "notes.txt"
    text.write_text("not a folder")
    for flags, line in ((["--deadline", "0"], "--deadline 0: must be a number of seconds > 0"),
                        (["--deadline", "-5"], "--deadline -5: must be a number of seconds > 0"),
                        (["--root", str(text)], f"--root {text}: not a folder: give the folder the job groups go")):
        assert gpu_jobs.main(["--accelerator", "cpu", "--root", str(tmp_path / "jobs"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gpu_jobs.py: {line}") and "\n" not in err
    job = gpu_jobs.lr_jobs(tmp_path, ("lstm",))[0]
    monkeypatch.setattr(gpu_jobs, "planned", lambda args: ([job], {}))
    for override, reason in (("model.lr=-1", "invalid model.lr=-1: must be a number > 0"),
                             ("+colour=red", "colour is not a key of this command's config")):
        assert gpu_jobs.main(["--accelerator", "cpu", "--root", str(tmp_path / "jobs"), override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gpu_jobs.py: {job.name} (train.py model=lstm") and reason in err, err
        assert err.endswith("; no job was started") and "\n" not in err
    assert not (tmp_path / "jobs").exists() and not job.folder.exists()


def test_gpu_jobs_counts_a_job_that_completed_as_the_deadline_came_as_completed(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_jobs

    finished, cut = gpu_jobs.lr_jobs(tmp_path, ("lstm",))[:2]
    for job in (finished, cut):
        job.folder.mkdir(parents=True)
        job.process = subprocess.Popen([sys.executable, "-c", "pass"])
    (finished.folder / "summary.json").write_text('{"status": "completed"}')
    said = []
    gpu_jobs.stop([finished, cut], said.append)
    assert (finished.status, cut.status) == ("completed", "stopped")
    assert said == [f"{finished.name}: completed as the deadline came", f"{cut.name}: stopped at the deadline (SIGINT)"]


# --- gpu_jobs.py called again after its deadline ----------------------------------------------------------------------

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
