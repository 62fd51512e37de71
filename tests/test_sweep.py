"""sweep.py: the smoke study end to end, W&B runs per job, a failing job, DDP, launchers.

The end-to-end tests run the real scripts in subprocesses, as a user would; the fast ones
check configs and argument handling in-process.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import CONF, REPO, finding_line
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from robustness_helpers import assert_untouched, fingerprint
from test_report import assert_valid_png, completed, make_job
from wandb_records import offline_runs

import sweep as sweep_script
from gru_experiments.errors import UserError
from gru_experiments.report.findings import STUDY
from gru_experiments.runs import distributed

SIX = ["astra_alpha", "astra_beta", "astra_gamma", "scribe_alpha", "scribe_beta", "scribe_gamma"]
NUMBERS = ["parameters", "train_loss", "val_loss", "val_bpc", "tokens_per_second", "wall_seconds"]
MODE_BPC = ["stateful_bpc", "stateless_bpc", "windowed_bpc", "bigram_bpc"]


def run_script(script: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PROJECT_ROOT": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def read_rows(sweep: Path) -> list[dict]:
    with open(sweep / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def tiny_overrides(corpus: Path, data_dir: Path) -> list[str]:
    """The smoke preset on the small generated corpus: seconds per job."""
    return ["preset=smoke", f"data.path={corpus}", f"paths.data_dir={data_dir}", "trainer.accelerator=cpu"]


# --- end to end ---------------------------------------------------------------------------
@pytest.mark.slow
def test_the_ladder_in_one_command(tiny_corpus, data_dir, tmp_path):
    """models=ladder: every family's rungs, one report with the ladder table and plot."""
    sweep = tmp_path / "ladder"
    result = run_script("sweep.py", "models=ladder", "logger=none", *tiny_overrides(tiny_corpus, data_dir),
                        f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ladder = ["ngram2", "ngram3", "ngram4", "ngram5", "ngram6", "ngram7", "mlp", "rnn", "astra_alpha_original",
              "lstm_original", "mingru_original", "minlstm_original", "transformer_original"]
    rows = read_rows(sweep)
    assert [row["model"] for row in rows] == ladder and {row["status"] for row in rows} == {"completed"}
    assert [row["family"] for row in rows] == ["ngram"] * 6 + ["mlp", "rnn", "gru", "lstm", "mingru", "minlstm",
                                                                   "transformer"]
    report = (sweep / "report.md").read_text()
    assert "## The ladder" in report and all(f"| {name} | " in report for name in ladder)
    # Astra-α and the transformer, both at the original recipe, face each other in the GRU-against-transformer
    # finding (a smoke run's figures: any verdict).
    seventh = finding_line(report, "GRUs remain competitive with transformers")
    assert "astra_alpha_original (" in seventh and "against transformer_original (" in seventh
    assert_valid_png(sweep / "ladder.png")


@pytest.mark.slow
def test_smoke_study_on_tiny_shakespeare(shakespeare, data_dir, tmp_path):
    sweep = tmp_path / "smoke_study"
    result = run_script("sweep.py", "preset=smoke", f"data.path={shakespeare}", f"paths.data_dir={data_dir}",
                        "trainer.accelerator=cpu", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    rows = read_rows(sweep)
    assert [row["model"] for row in rows] == SIX and {row["status"] for row in rows} == {"completed"}
    assert [row["tokenizer"] for row in rows] == ["char"] * 3 + ["spm"] * 3
    present_modes = [key for key in MODE_BPC if any(row[key] for row in rows)]
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        for key in NUMBERS + present_modes:
            assert math.isfinite(float(row[key])) and float(row[key]) == pytest.approx(summary[key]), (
                row["model"], key)
    for name in ("bpc_by_mode.png", "curves.png", "context_curve.png", "modes_over_training.png"):
        assert_valid_png(sweep / name)
    report = (sweep / "report.md").read_text()
    assert all(f"| {name} |" in report for name in SIX)
    # The study's figures: every job's context curve (point "1" is its stateless figure), the modes
    # at every validation, the best checkpoint, and the findings judged from them.
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        curve = summary["context_curve"]  # point "1" is the stateless figure, exact or a sample of it
        se = curve["settings"]["bpc_se"]["1"]
        assert abs(curve["1"] - summary["stateless_bpc"]) <= (4 * se if se else 1e-4), (row["model"], se)
        assert summary["best"]["step"] <= summary["train_steps"]
        history = (Path(row["run_dir"]) / "history.csv").read_text()
        assert history.count("val/stateful_bpc") == history.count("val/stateless_bpc") == 2  # 2 epochs
    findings = report.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert ([line[:3] for line in findings.splitlines() if line[:1].isdigit()]
            == [f"{i}. " for i in range(1, len(STUDY.rules) + 1)])
    assert "cannot be judged" not in finding_line(report, "Subword models amplify inference-time errors")  # char, spm

    # W&B: every job its own offline run in the sweep's group, holding its metrics.
    for row in rows:
        [run] = offline_runs(Path(row["run_dir"]))
        assert run.name == row["model"] and run.group == "smoke_study" and run.exit_code == 0
        assert run.summary["val_bpc"] == pytest.approx(float(row["val_bpc"]))
        assert len(run.series("val/bpc")) == 2 and len(run.series("train/loss")) > 0  # 2 epochs
        assert len(run.series("val/stateful_bpc")) == 2 and len(run.series("val/stateless_bpc")) == 2
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert run.series("context_curve/1") == [pytest.approx(summary["context_curve"]["1"])]
        assert any("context_curve/plot_table" in entry for entry in run.history)  # the W&B line plot
    [summary_run] = offline_runs(sweep)
    [table] = [entry["results"] for entry in summary_run.history if "results" in entry]
    assert summary_run.group == "smoke_study" and table["nrows"] == 6


@pytest.mark.slow
def test_a_failing_job_is_marked_and_the_others_complete(tiny_corpus, data_dir, tmp_path):
    # A real failure: the tiny corpus cannot give SentencePiece the 1000 pieces scribe_alpha asks for.
    sweep = tmp_path / "with_failure"
    result = run_script("sweep.py", "models=[scribe_alpha,astra_alpha]", *tiny_overrides(tiny_corpus, data_dir),
                        "logger=wandb", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1
    assert "not every job completed: scribe_alpha (failed, 0_scribe_alpha)" in result.stderr

    failed, done = read_rows(sweep)
    assert (failed["model"], failed["status"], done["model"], done["status"]) == (
        "scribe_alpha", "failed", "astra_alpha", "completed")
    assert ("tokenizer.vocab_size=1000 is too large for this corpus" in failed["error"]
            and math.isfinite(float(done["val_bpc"])))
    missing = (sweep / "report.md").read_text().split("## What is missing")[1]
    assert "**scribe_alpha** failed (`0_scribe_alpha`)" in missing

    [failed_run] = offline_runs(Path(failed["run_dir"]))
    [done_run] = offline_runs(Path(done["run_dir"]))
    assert failed_run.exit_code == 1 and failed_run.summary["status"] == "failed"
    assert done_run.exit_code == 0 and done_run.summary["status"] == "completed"
    assert failed_run.group == done_run.group == "with_failure"

    # Rebuilding the report over the folder gives the same files.
    before = {name: (sweep / name).read_bytes() for name in ("report.md", "results.csv", "bpc_by_mode.png")}
    again = run_script("sweep.py", f"report={sweep}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert before == {name: (sweep / name).read_bytes() for name in before}


@pytest.mark.slow
def test_ddp_on_cpu_with_two_processes_writes_one_summary(tiny_corpus, data_dir, tmp_path):
    run_dir = tmp_path / "ddp_run"
    result = run_script("train.py", "trainer=ddp", "trainer.devices=2", *tiny_overrides(tiny_corpus, data_dir),
                        "logger=none", f"hydra.run.dir={run_dir}", f"paths.log_dir={tmp_path / 'outputs'}")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["train_steps"] == 10
    assert len(list(tmp_path.rglob("summary.json"))) == 1
    history = list(csv.DictReader(open(run_dir / "history.csv")))
    train_steps = [row["step"] for row in history if row["metric"] == "train/loss"]
    assert len(train_steps) == len(set(train_steps)) == 10  # written by rank zero alone


@pytest.mark.slow
def test_ddp_inside_a_sweep(tiny_corpus, data_dir, tmp_path):
    """A multirun job with DDP runs as a single run in a child process (distributed.py)."""
    sweep = tmp_path / "ddp_sweep"
    result = run_script("sweep.py", "models=[astra_alpha]", "trainer=ddp", "trainer.devices=2",
                        *tiny_overrides(tiny_corpus, data_dir), "logger=none", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-4000:]
    [row] = read_rows(sweep)
    assert row["status"] == "completed"
    assert json.loads((Path(row["run_dir"]) / "summary.json").read_text())["world_size"] == 2
    assert [p.parent.name for p in tmp_path.rglob("summary.json")] == ["0_astra_alpha"]


@pytest.mark.slow
def test_parallel_launcher_then_report_over_a_train_py_sweep(tiny_corpus, data_dir, tmp_path):
    sweep = tmp_path / "parallel"
    result = run_script("train.py", "-m", "model=astra_alpha,astra_beta", "hydra/launcher=parallel",
                        *tiny_overrides(tiny_corpus, data_dir), "logger=none", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr  # the jobs ran side by side
    report = run_script("sweep.py", f"report={sweep}")
    assert report.returncode == 0, report.stderr[-3000:]
    assert [(row["model"], row["status"]) for row in read_rows(sweep)] == [
        ("astra_alpha", "completed"), ("astra_beta", "completed")]


# --- configs and arguments (fast) ----------------------------------------------------------
def compose_hydra(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize("launcher, target", [
    ("parallel", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
    ("joblib", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
    ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
])
def test_launcher_configs_compose(launcher, target):
    cfg = compose_hydra(f"hydra/launcher={launcher}", "preset=smoke")
    assert cfg.hydra.launcher._target_ == target
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.timeout_min == 720
    if launcher == "parallel":
        assert cfg.hydra.launcher.n_jobs == 2


def test_ddp_trainer_and_smoke_preset_compose():
    cfg = compose_hydra("trainer=ddp", "trainer.num_nodes=2", "model=scribe_gamma", "preset=smoke")
    assert cfg.trainer.strategy == "ddp" and cfg.trainer.num_nodes == 2 and cfg.trainer.devices == "auto"
    # the preset beats the model's own recipe, the command line beats the preset
    assert cfg.model.steps_per_epoch == 5 and cfg.model.epochs == 2 and cfg.tokenizer.kind == "spm"
    assert compose_hydra("preset=smoke", "model.epochs=3").model.epochs == 3
    assert compose_hydra("model=scribe_gamma").model.steps_per_epoch == 400  # preset=full changes nothing


def test_sweep_arguments():
    settings, overrides = sweep_script.parse_arguments(
        ["preset=smoke", "models=[astra_alpha,scribe_beta]", "leviathan=true", "data.path=x.txt",
         "hydra/launcher=parallel"])
    assert list(settings.models) == ["astra_alpha", "scribe_beta", "leviathan"] and settings.report is None
    assert overrides == ["preset=smoke", "data.path=x.txt", "hydra/launcher=parallel"]
    settings, _ = sweep_script.parse_arguments(["models=astra_beta,astra_gamma"])
    assert list(settings.models) == ["astra_beta", "astra_gamma"]
    assert list(sweep_script.parse_arguments([])[0].models) == SIX
    with pytest.raises(UserError, match="unknown model"):
        sweep_script.parse_arguments(["models=[astra_delta]"])
    with pytest.raises(UserError, match="none given"):
        sweep_script.parse_arguments(["models=[]"])
    with pytest.raises(UserError, match="chooses the models with models="):
        sweep_script.parse_arguments(["model=astra_alpha"])


def test_sweep_folder_is_fixed_before_the_jobs_start(tmp_path):
    assert sweep_script.resolve_sweep_dir("model=astra_alpha", [f"hydra.sweep.dir={tmp_path}/s"]) == tmp_path / "s"
    default = sweep_script.resolve_sweep_dir("experiment=recall_beta_streams", [f"paths.log_dir={tmp_path}"])
    assert default.parent == tmp_path / "multiruns"


def test_experiments_are_the_jobs_instead_of_models(compose_config):
    settings, overrides = sweep_script.parse_arguments(["experiments=recall_horizon", "probe=recall,none"])
    assert list(settings.experiments[:6]) == [
        "recall_alpha_windows", "recall_alpha_streams", "recall_alpha_long_windows", "recall_beta_windows",
        "recall_beta_streams", "recall_transformer_windows"]
    assert overrides == ["probe=recall,none"]
    settings, _ = sweep_script.parse_arguments(["experiments=[recall_alpha_streams]"])
    assert list(settings.experiments) == ["recall_alpha_streams"]
    with pytest.raises(UserError, match="unknown experiment"):
        sweep_script.parse_arguments(["experiments=[recall_gamma]"])
    # experiments= with models= would silently drop the models: refused, naming both keys
    with pytest.raises(UserError, match="^models= and experiments= both pick the jobs"):
        sweep_script.parse_arguments(["models=ladder", "experiments=recall_horizon"])
    with pytest.raises(UserError, match="'experiment=recall_alpha_streams': sweep.py chooses"):
        sweep_script.parse_arguments(["models=grid", "experiment=recall_alpha_streams"])
    # each experiment is its model and training: the long windows are 512 at batch 16
    cfg = compose_config("experiment=recall_alpha_long_windows", "probe=recall")
    assert (cfg.model.name, cfg.training.batching, cfg.data.seq_len, cfg.data.batch_size) == (
        "astra_alpha", "windows", 512, 16)
    cfg = compose_config("experiment=recall_beta_streams")
    assert (cfg.model.name, cfg.training.batching, cfg.probe.name, cfg.optim.name) == (
        "astra_beta", "streams", "none", "original")
    assert compose_config("experiment=recall_transformer_windows").optim.name == "transformer"


def test_a_list_of_models_is_one_multirun_in_its_order(capsys, monkeypatch, tmp_path):
    """models=ladder names two variants (astra_alpha_original, transformer_original), model configs of their
    own: the multirun is over model= in the list's order; experiments= over experiment=."""
    commands = []
    monkeypatch.setattr(sweep_script.subprocess, "run", lambda command, check: commands.append(command) or
                        SimpleNamespace(returncode=0))
    for argv in (["models=ladder"], ["experiments=[recall_alpha_streams,recall_beta_windows]"]):
        settings, _ = sweep_script.parse_arguments(argv)
        sweep_script.run_sweep(settings, [f"hydra.sweep.dir={tmp_path}"])
    ladder = ("model=ngram2,ngram3,ngram4,ngram5,ngram6,ngram7,mlp,rnn,astra_alpha_original,lstm_original,"
              "mingru_original,minlstm_original,transformer_original")
    assert commands[0][3] == ladder and commands[1][3] == "experiment=recall_alpha_streams,recall_beta_windows"
    settings, _ = sweep_script.parse_arguments(["models=[astra_beta,transformer_beta_original]"])
    assert list(settings.models) == ["astra_beta", "transformer_beta_original"]


def test_a_sweep_with_a_job_not_completed_exits_1_naming_it(capsys, monkeypatch, tmp_path):
    """sweep.py's ending, in-process (the jobs stubbed): the report is written, and a failed job makes the exit
    status 1 with one line naming it; a sweep whose jobs all completed exits 0."""
    (tmp_path / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: []\n")
    make_job(tmp_path, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    monkeypatch.setattr(sweep_script, "run_sweep", lambda settings, overrides: (tmp_path, 0))
    assert sweep_script.main([]) == 0
    make_job(tmp_path, 1, "mingru", summary={"status": "failed", "model": "mingru", "error": "RuntimeError: boom"})
    assert sweep_script.main([]) == 1
    err = capsys.readouterr().err
    assert "sweep.py: not every job completed: mingru (failed, 1_mingru); see the report" in err
    assert (tmp_path / "report.md").is_file()


def test_bad_overrides_stop_the_sweep_before_any_job(tmp_path):
    with pytest.raises(UserError, match="do not compose: .*trainer.no_such_key"):
        sweep_script.main(["trainer.no_such_key=1", f"hydra.sweep.dir={tmp_path}/s"])
    with pytest.raises(UserError, match="^invalid model.lr=nan: must be a finite number"):  # issue 72: every job failed
        sweep_script.main(["model.lr=nan", f"hydra.sweep.dir={tmp_path}/s"])
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_report_of_a_folder_without_results_says_so(tmp_path):
    """A sweep folder (Hydra's multirun.yaml) whose jobs never started; a folder that is no sweep's:
    test_sweep_report_refuses_a_folder_that_is_not_a_sweep_and_writes_nothing."""
    (tmp_path / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: []\n")
    result = run_script("sweep.py", f"report={tmp_path}", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: no results in {tmp_path}: no job folders")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun.yaml"]  # nothing written


def test_only_multirun_ddp_jobs_run_in_their_own_process(compose_config, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.setattr(distributed, "multirun_sweep_dir", lambda: "/sweeps/s1")

    def strategy(*overrides):  # as train.py passes it
        return compose_config(*overrides).trainer.get("strategy")

    assert distributed.needs_own_process(strategy("trainer=ddp"))
    assert not distributed.needs_own_process(strategy())  # strategy auto: one process
    assert not distributed.needs_own_process(strategy("trainer=ddp", "trainer.strategy=ddp_spawn"))
    monkeypatch.setenv("LOCAL_RANK", "0")  # ranks started by torchrun or SLURM
    assert not distributed.needs_own_process(strategy("trainer=ddp"))
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setattr(distributed, "multirun_sweep_dir", lambda: None)  # a single run
    assert not distributed.needs_own_process(strategy("trainer=ddp"))


def test_a_multirun_ddp_job_trains_in_a_child_that_keeps_its_folder_number_and_group(tmp_path, monkeypatch, capsys):
    """distributed.run_in_own_process with Hydra's job config a stand-in and a child script that records its
    arguments and writes the summary a run would: the job's overrides, folder, number and the sweep's W&B group on
    its command line; the child's summary handed back; a child that fails raises, naming the folder."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    job_dir = tmp_path / "sweep" / "2_astra_alpha"
    job_dir.mkdir(parents=True)
    job = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(job_dir)), job=SimpleNamespace(num=2),
                          overrides=SimpleNamespace(task=["model=astra_alpha", "trainer=ddp"]))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: job))
    monkeypatch.setattr(distributed, "multirun_sweep_dir", lambda: str(tmp_path / "sweep"))
    child = tmp_path / "child.py"
    child.write_text("import json, pathlib, sys\n"
                     "run = pathlib.Path(sys.argv[-3].split('=', 1)[1].strip('\"'))\n"
                     "(run / 'summary.json').write_text(json.dumps({'status': 'completed', 'argv': sys.argv[1:]}))\n"
                     "sys.exit(int(run.name.startswith('3')))\n")
    summary = distributed.run_in_own_process(str(child), {"_target_": "WandbLogger", "group": None})
    expected = ["model=astra_alpha", "trainer=ddp", f'hydra.run.dir="{job_dir}"', "hydra.job.num=2",
                'logger.group="sweep"']
    assert summary == {"status": "completed", "argv": expected}
    assert capsys.readouterr().out.startswith("DDP in a multirun job: training in a child process: ")
    failing = tmp_path / "sweep" / "3_astra_alpha"
    failing.mkdir()
    job.runtime.output_dir = str(failing)
    with pytest.raises(RuntimeError, match=f"^the training process of {failing} exited with code 1$"):
        distributed.run_in_own_process(str(child), None)


# --- a sweep folder holds one sweep (runs/sweep_dir.py) -----------------------------------------
def sweep_folder_of(sweep: Path, task: list[str]) -> Path:
    """A sweep folder as Hydra's multirun leaves it: its multirun.yaml recording the task overrides."""
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text(json.dumps({"hydra": {"overrides": {"task": task}}}))
    return sweep


def stub_jobs(monkeypatch) -> list[list[str]]:
    """subprocess.run stubbed: the commands sweep.py would run, each exiting 0."""
    commands = []
    monkeypatch.setattr(sweep_script.subprocess, "run", lambda command, check: commands.append(command) or
                        SimpleNamespace(returncode=0))
    return commands


def test_another_sweep_into_a_sweeps_folder_is_refused_before_anything_is_written(monkeypatch, tmp_path):
    sweep = sweep_folder_of(tmp_path / "SW", ["model=astra_alpha,mlp", "trainer.max_steps=10"])
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    commands = stub_jobs(monkeypatch)
    with pytest.raises(UserError, match=r"^\S+/SW holds another sweep \(it ran with trainer.max_steps=10; this "
                                        r"command asks for trainer.max_steps=12\), and a sweep folder holds one sweep"):
        sweep_script.main(["models=[astra_alpha,mlp]", "trainer.max_steps=12", f"hydra.sweep.dir={sweep}"])
    with pytest.raises(UserError, match=r"\(it ran with model=astra_alpha,mlp; this command asks for model=astra_alpha "
                                        r"seed=1,2\)"):
        sweep_script.main(["models=astra_alpha", "trainer.max_steps=10", "seeds=2", f"hydra.sweep.dir={sweep}"])
    assert commands == [] and {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


def test_the_same_sweep_again_resumes_its_cut_jobs_then_runs_the_multirun(monkeypatch, tmp_path):
    """The same overrides in another order are the same sweep: its cut job (a last checkpoint, no summary) is
    resumed as a single run, then the multirun runs every job (a completed one skips itself: completed_job)."""
    sweep = sweep_folder_of(tmp_path / "SW", ["model=astra_alpha,mlp", "trainer.max_steps=10"])
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    cut = make_job(sweep, 1, "mlp")
    (cut / "checkpoints").mkdir()
    (cut / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    commands = stub_jobs(monkeypatch)
    settings, overrides = sweep_script.parse_arguments(["trainer.max_steps=10", "models=[astra_alpha,mlp]",
                                                        f"hydra.sweep.dir={sweep}"])
    assert sweep_script.run_sweep(settings, overrides) == (sweep, 0)
    assert [command[2:] for command in commands] == [
        [f"resume={cut}"], ["-m", "model=astra_alpha,mlp", "trainer.max_steps=10", f'hydra.sweep.dir="{sweep}"']]


def test_two_sweeps_at_once_into_one_folder_the_second_is_refused_naming_the_lock(monkeypatch, tmp_path):
    from gru_experiments.errors import RunFolderTaken
    from gru_experiments.runs.sweep_dir import SweepDir

    commands = stub_jobs(monkeypatch)
    with SweepDir(tmp_path / "SW").claim(["model=astra_alpha"]):  # the first sweep, running
        with pytest.raises(RunFolderTaken, match=r"SW is in use: another sweep is running in it \(it holds the "
                                                 r"folder's lock\), so this sweep cannot start there"):
            sweep_script.main(["models=astra_alpha", f"hydra.sweep.dir={tmp_path / 'SW'}"])
    assert commands == [] and list((tmp_path / "SW").iterdir()) == []


def test_a_sweep_folder_in_a_run_folder_or_a_file_is_refused(monkeypatch, tmp_path):
    commands = stub_jobs(monkeypatch)
    run = make_job(tmp_path, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    (tmp_path / "notes.txt").write_text("mine")
    for sweep, answer in ((run / "checkpoints" / "s", rf"is inside the folder of a run \({run}\)"),
                          (run, rf"is the folder of a run \({run}\)"),
                          (tmp_path / "notes.txt", r"is a file; the sweep folder is a folder"),
                          (tmp_path / "notes.txt" / "s", r"is a file")):
        with pytest.raises(UserError, match=f"^hydra.sweep.dir={sweep}(: \\S+)? {answer}"):
            sweep_script.main(["models=astra_alpha", f"hydra.sweep.dir={sweep}"])
    assert commands == [] and not (run / "checkpoints").exists()


def test_a_new_run_inside_a_runs_checkpoints_folder_is_refused(tmp_path):
    from gru_experiments.errors import RunFolderTaken
    from gru_experiments.runs.run_dir import RunDir

    run = make_job(tmp_path / "SW", 0, "astra_alpha")
    with pytest.raises(RunFolderTaken, match=rf"^{run}/checkpoints/mine is inside the folder of a run \({run}\)"):
        with RunDir(run / "checkpoints" / "mine").claim():
            pass
    assert not (run / "checkpoints" / "mine").exists()
    with RunDir(tmp_path / "SW" / "1_mlp").claim():  # a sweep's folder is no run's: its jobs go in it
        pass


def test_a_continued_sweeps_completed_job_skips_itself(monkeypatch, tmp_path):
    """In a multirun job, a folder holding this very job (its recorded overrides) completed: its summary, and the
    job trains nothing; the same folder under other overrides, or failed: None (the folder refuses a new run)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from gru_experiments.runs import jobs, sweep_dir

    job_dir = make_job(tmp_path, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    OmegaConf.save(["model=astra_alpha", "seed=1"], job_dir / ".hydra" / "overrides.yaml")
    cfg = OmegaConf.create({"paths": {"output_dir": str(job_dir)}})
    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    for task, skipped in ((["seed=1", "model=astra_alpha"], True), (["model=astra_alpha", "seed=2"], False)):
        monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda task=task: SimpleNamespace(
            overrides=SimpleNamespace(task=task))))
        assert (sweep_dir.completed_job(cfg) is not None) is skipped


@pytest.mark.slow
def test_the_same_sweep_again_completes_what_is_missing_and_changes_no_completed_job(tiny_corpus, data_dir, tmp_path):
    """Issue 72's bar: a different sweep leaves the folder byte-identical; the same one again resumes a cut job
    and leaves a completed one byte for byte (a missing job: test_the_same_sweep_again_resumes_its_cut_jobs_...)."""
    sweep = tmp_path / "SW"
    args = ["models=[astra_alpha,mlp]", "logger=none", "evaluation.text.samples=0",
            *tiny_overrides(tiny_corpus, data_dir), f"hydra.sweep.dir={sweep}"]
    assert run_script("sweep.py", *args).returncode == 0

    def files():
        return {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}

    before = files()
    other = run_script("sweep.py", *args, "trainer.max_steps=12")
    assert other.returncode == 2 and "holds another sweep" in other.stderr and files() == before
    (sweep / "0_astra_alpha" / "summary.json").unlink()  # cut after its last checkpoint
    kept = {p: data for p, data in before.items() if p.is_relative_to(sweep / "1_mlp")}
    again = run_script("sweep.py", *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming the cut job 0_astra_alpha" in again.stdout and "this job completed before" in again.stdout
    assert {p: data for p, data in files().items() if p.is_relative_to(sweep / "1_mlp")} == kept
    assert [row["status"] for row in read_rows(sweep)] == ["completed", "completed"]


def test_every_command_in_the_docs_parses_as_written():
    """Issue 72: docs/sweeps.md's own data.path=~/my_text.txt ended in Hydra's lexer error. Each `python sweep.py`,
    `train.py` or `sample.py` line of the docs' code blocks (no placeholder in it): sweep.py's arguments, and each
    override through Hydra's parser, as the scripts read them (runs/jobs.command_line first)."""
    import re
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from gru_experiments.runs.jobs import command_line

    commands = []
    for doc in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            commands += [line for line in block.splitlines()
                         if re.match(r"\s*([A-Z_]+=\S+ )*python (sweep|train|sample)\.py", line)
                         and not re.search(r"<|\.\.\.|\\$|\|", line)]
    assert any("data.path=~/my_text.txt" in command for command in commands) and len(commands) > 20
    for command in commands:
        argv = shlex.split(command, comments=True)
        script = next(arg for arg in argv if arg.endswith(".py"))
        argv = [arg for arg in command_line([script, *argv[argv.index(script) + 1:]])[1:]
                if not arg.startswith("-")]
        if script == "sweep.py":
            argv = sweep_script.parse_arguments(argv)[1]
        OverridesParser.create().parse_overrides(argv)


def test_sweep_refuses_leviathan_with_experiments_and_takes_a_list_of_sets(compose_config):
    with pytest.raises(UserError, match="^leviathan=true adds Leviathan to models=; experiments= names its own"):
        sweep_script.parse_arguments(["experiments=scale", "leviathan=true"])
    settings, _ = sweep_script.parse_arguments(["experiments=[scale,recall_horizon]"])
    sets = OmegaConf.load(sweep_script.CONF / "sweep.yaml").experiment_sets
    assert list(settings.experiments) == [*sets.scale, *sets.recall_horizon]
    settings, _ = sweep_script.parse_arguments(["models=[beta,astra_alpha]"])
    assert list(settings.models) == ["astra_beta", "transformer_beta", "astra_alpha"]
    with pytest.raises(UserError, match=r"unknown experiment\(s\) \['scale_delta'\]"):
        sweep_script.parse_arguments(["experiments=[scale,scale_delta]"])


@pytest.mark.parametrize("argument", ["report=", "report=''", "models="])
def test_sweep_refuses_an_empty_value_rather_than_start_the_whole_study(argument):
    with pytest.raises(UserError, match=r"gives (report|models) no value, and the whole default study would start"):
        sweep_script.main([argument])


def test_sweep_report_refuses_a_folder_that_is_not_a_sweep_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"  # outputs/runs/<model>/: single runs, each with its .hydra/ and summary.json
    (runs / "run1" / ".hydra").mkdir(parents=True)
    (runs / "run1" / "summary.json").write_text('{"status": "completed"}')
    before = fingerprint(tmp_path)
    with pytest.raises(UserError, match=f"^{runs} is not a sweep folder: it has no multirun.yaml"):
        sweep_script.main([f"report={runs}"])
    with pytest.raises(UserError, match=f"^{runs / 'run1'} is the folder of a single run: it has no multirun.yaml"):
        sweep_script.main([f"report={runs / 'run1'}"])
    assert_untouched(before, fingerprint(tmp_path))


def test_sweep_trains_a_model_named_twice_once_and_says_so(capsys):
    settings, _ = sweep_script.parse_arguments(["models=[astra_alpha,astra_alpha]"])
    assert list(settings.models) == ["astra_alpha"]
    assert "models= names astra_alpha more than once: each is trained once" in capsys.readouterr().out
    settings, _ = sweep_script.parse_arguments(["models=[ladder,mlp]", "seeds=2"])  # a set, then one of its names
    assert list(settings.models).count("mlp") == 1
