"""Issue 74: a run folder is data, not code. A callable planted in a run's saved files (its .hydra/config.yaml, its
hydra.yaml, a resume's record, its recorded command line) is never called by resume=, sample.py, the API, sweep.py
report=, the upgrade tool or gpu_jobs.py: each refuses in one line naming the key and the file, the folder
byte-identical. What this command line types stays the user's. Every checkpoint load passes weights_only=True."""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from robustness_helpers import assert_untouched, fingerprint

import gru_experiments
from gru_experiments.errors import UserError
from gru_experiments.runs.run_contents import CONFIG_TARGETS, HYDRA_TARGETS, allowed, check_record

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["preset=smoke", "logger=none", "trainer.max_steps=4", "checkpoint.every_n_steps=2",
             "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory, tiny_corpus) -> Path:
    """A run cut after its last checkpoint (its summary gone): what a resume takes; copy it before planting."""
    root = tmp_path_factory.mktemp("honest")
    summary = gru_experiments.train([*OVERRIDES, f"data.path={tiny_corpus}"], root=root)
    run = Path(summary["run_dir"])
    (run / "summary.json").unlink()
    return run


def plant(run: Path, where: str, marker: Path) -> None:
    """os.makedirs(marker) named in one of the run's saved files: a call leaves the folder `marker` behind."""
    planted = {"_target_": "os.makedirs", "name": str(marker), "exist_ok": True}
    hydra = run / ".hydra"
    if where == "resumed record":
        record = hydra / "resumed_2030-01-01_00-00-00_000000"
        shutil.copytree(hydra, record)
        where, hydra = "logger", record
    if where == "hydra.yaml":
        config = yaml.safe_load((hydra / "hydra.yaml").read_text())
        config["hydra"]["launcher"] = planted
        (hydra / "hydra.yaml").write_text(yaml.safe_dump(config))
    elif where == "overrides.yaml":
        (hydra / "overrides.yaml").write_text(yaml.safe_dump(["logger._target_=os.makedirs", f"+logger.name={marker}"]))
    else:
        config = yaml.safe_load((hydra / "config.yaml").read_text())
        config[where] = {**config[where], **planted} if where != "logger" else planted
        (hydra / "config.yaml").write_text(yaml.safe_dump(config))


PLACES = ["logger", "trainer", "early_stopping", "hydra.yaml", "resumed record", "overrides.yaml"]
FILES = ["logger", "hydra.yaml", "resumed record"]  # a file of each kind: the other paths read them by the same check


def planted_copy(honest_run: Path, tmp_path: Path, place: str) -> tuple[Path, Path, dict]:
    """(run, marker, fingerprint): a copy of the honest run with os.makedirs planted at `place`."""
    root = tmp_path / "root"
    run = root / "outputs" / "runs" / "astra_alpha" / honest_run.name
    shutil.copytree(honest_run, run)
    marker = tmp_path / "PWNED"
    plant(run, place, marker)
    return run, marker, fingerprint(run)


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and "names a callable this project does not build from a run folder" in message
    return message


@pytest.mark.parametrize("place", PLACES)
def test_a_resume_never_calls_what_a_run_folder_names(honest_run, tmp_path, place):
    run, marker, before = planted_copy(honest_run, tmp_path, place)
    message = refused(gru_experiments.train, [f"resume={run}"], root=run.parents[3])
    assert str(run / ".hydra") in message and "=" in message.split(": ")[1]
    assert not marker.exists()
    assert_untouched(before, fingerprint(run))


@pytest.mark.parametrize("place", FILES)
def test_the_api_and_sample_py_never_call_what_a_run_folder_names(honest_run, tmp_path, place):
    from hydra import compose, initialize_config_dir

    from gru_experiments.runs.run_dir import find_checkpoint
    from gru_experiments.runs.sample_checks import validate_sample
    from gru_experiments.runs.sampling import sample

    run, marker, before = planted_copy(honest_run, tmp_path, place)
    refused(gru_experiments.load, run)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("sample", [f"run={run}", "evaluate=true", f"paths.output_dir={tmp_path / 'samples'}"])
    spec = validate_sample(cfg)
    refused(sample, spec, find_checkpoint("astra_alpha", tmp_path, run=str(run)))
    assert not marker.exists()
    assert_untouched(before, fingerprint(run))


@pytest.mark.parametrize("place", FILES)
def test_the_sweep_report_the_upgrade_tool_and_gpu_jobs_never_call_what_a_run_folder_names(honest_run, tmp_path, place,
                                                                                           monkeypatch, capsys):
    from gru_experiments.report.sweep_folder import collect

    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "tools"))
    import gpu_jobs
    import upgrade_run_folder

    sweep = tmp_path / "sweep"
    job = sweep / "0_astra_alpha"
    shutil.copytree(honest_run, job)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["model=astra_alpha"]}}}))
    marker = tmp_path / "PWNED"
    plant(job, place, marker)
    before = fingerprint(sweep)
    refused(collect, sweep)
    assert upgrade_run_folder.main([str(sweep)]) == 2
    assert "error: " in capsys.readouterr().err
    # gpu_jobs.py: a job folder it would resume, checked before any job starts
    root = tmp_path / "multiruns"
    shutil.copytree(job, root / "lr_min" / "12_lstm_lr1e-3")
    monkeypatch.setattr(gpu_jobs.subprocess, "Popen", lambda *a, **k: pytest.fail("a job started"))
    assert gpu_jobs.main(["--only", "lstm", "--accelerator", "cpu", "--root", str(root)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("gpu_jobs.py: ") and "_target_='os.makedirs'" in line and "\n" not in line
    assert not marker.exists()
    assert_untouched(before, fingerprint(sweep))


def test_what_the_command_line_types_stays_the_users(honest_run, tmp_path):
    """A logger chosen now (logger=csv) replaces the planted one, which is then never read; a _target_ typed now is
    taken as typed; a group chosen as the run chose it keeps the run's keys, so the planted one is refused."""
    run, marker, _ = planted_copy(honest_run, tmp_path, "logger")
    refused(gru_experiments.train, [f"resume={run}", "logger=none"], root=run.parents[3])  # as the run chose: its keys
    summary = gru_experiments.train([f"resume={run}", "logger=csv"], root=run.parents[3])
    assert summary["status"] == "completed" and not marker.exists() and (run / "csv").is_dir()
    mine = tmp_path / "MINE"
    check_record({"logger": {"_target_": "os.makedirs"}}, "config.yaml", named=("logger._target_",))
    check_record({"logger": {"_target_": "os.makedirs", "name": str(mine)}}, "config.yaml",
                 own={"logger": {"_target_": "os.makedirs"}})


def test_a_run_scores_its_own_best_checkpoint_whatever_its_command_line_named(honest_run, tmp_path):
    """A new run's own command line may name a logger of its own (logger._target_=...): its config records it, and at
    the end of its training its best checkpoint is still scored (load's own_run); another command refuses the folder."""
    from gru_experiments.runs.run_dir import RunDir
    from gru_experiments.runs.trained_run import load

    run, marker, _ = planted_copy(honest_run, tmp_path, "logger")
    best = run / "checkpoints" / "last.ckpt"  # the end of training loads its best checkpoint so
    assert load(best, folder=RunDir(run), own_run=True).model is not None
    refused(load, best, folder=RunDir(run))
    assert not marker.exists()


def test_the_allow_list_names_every_callable_the_configs_offer_and_nothing_else():
    """One home: every _target_ of conf/ (trainer, logger, early_stopping, optim, each model, Hydra's launchers) is
    allowed where it sits; a callable elsewhere, another module's class or a model class outside the package is not."""
    targets = {}
    for path in (REPO / "conf").rglob("*.yaml"):
        for match in re.finditer(r"_target_: (\S+)", path.read_text()):
            group = path.relative_to(REPO / "conf").parts[0]
            key = {"model": "model.architecture._target_", "experiment": None}.get(group, f"{group}._target_")
            if key is not None:
                targets.setdefault(key, set()).add(match[1].rstrip("}").rstrip(","))
    assert set(targets) == set(CONFIG_TARGETS), targets
    for key, values in targets.items():
        assert all(allowed(key, value) for value in values), (key, values)
    assert all(allowed(key, value) for key, values in HYDRA_TARGETS.items() for value in values)
    for key, value in [("logger._target_", "os.makedirs"), ("trainer._target_", "lightning.pytorch.loggers.CSVLogger"),
                       ("model.architecture._target_", "os.system"), ("model.architecture._target_", "tests.Model"),
                       ("model.architecture._target_", "gru_experiments.models.protocol.importlib"),
                       ("trainer.callbacks.0._target_", "lightning.pytorch.Trainer"),
                       ("hydra.job_logging.handlers.file.class", "subprocess.Popen"),
                       ("hydra.job_logging.handlers.console.stream", "ext://os.system")]:
        assert not allowed(key, value), (key, value)
    assert allowed("model.architecture._target_", "gru_experiments.models.ngram.NGramLM")
    assert allowed("hydra.job_logging.handlers.file.class", "logging.FileHandler")


# --- every checkpoint load is weights-only --------------------------------------------------------------------------
CKPT_CALLS = ("fit", "validate", "test", "predict")  # Trainer calls that load a ckpt_path


def loads_without_weights_only(source: str) -> list[int]:
    """The lines of `source` that load a checkpoint without weights_only=True: torch.load, load_from_checkpoint, a
    Trainer's fit/validate/test/predict given ckpt_path; and a Trainer's save_checkpoint that leaves weights_only to
    Lightning's default (which it announces as a load's: "weights_only was not set, defaulting to False")."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, keywords = node.func.attr, {k.arg: k.value for k in node.keywords}
        value = keywords.get("weights_only")
        is_true = isinstance(value, ast.Constant) and value.value is True
        torch_load = name == "load" and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
        if torch_load or name == "load_from_checkpoint" or (name in CKPT_CALLS and "ckpt_path" in keywords):
            bad += [] if is_true else [node.lineno]
        elif name == "save_checkpoint" and value is None and len(node.args) < 2:
            bad.append(node.lineno)
    return bad


def test_no_checkpoint_in_the_package_loads_without_weights_only():
    files = [*(REPO / "gru_experiments").rglob("*.py"), REPO / "train.py", REPO / "sample.py", REPO / "sweep.py",
             *(REPO / "tools").glob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    found = {str(f.relative_to(REPO)): lines for f in files if (lines := loads_without_weights_only(f.read_text()))}
    assert not found, found
    # the scan itself: each kind of load it must catch
    assert loads_without_weights_only("torch.load(p)\ntorch.load(p, weights_only=False)\ntrainer.fit(m, ckpt_path=p)\n"
                                      "Task.load_from_checkpoint(p)\ntrainer.save_checkpoint(p)\n") == [1, 2, 3, 4, 5]
    assert not loads_without_weights_only("torch.load(p, weights_only=True)\ntrainer.fit(m)\n"
                                          "trainer.save_checkpoint(p, weights_only=False)\n")


@pytest.mark.slow  # a training; the scan above holds its save to weights_only
def test_a_counted_model_says_nothing_of_weights_only(tmp_path, caplog, tiny_corpus):
    summary = gru_experiments.train(["model=ngram2", "preset=smoke", "logger=none", "trainer.enable_progress_bar=false",
                                     f"data.path={tiny_corpus}"], root=tmp_path)
    assert summary["status"] == "completed"
    assert "weights_only" not in caplog.text
