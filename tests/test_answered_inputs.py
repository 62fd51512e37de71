"""Inputs of issue 62 that started the wrong work, were silently ignored or ended in a traceback: each is now
answered in one line before any work (or done as asked). sweep.py's report= and models=, early stopping's keys,
trainer.precision, sample.py's settings, the benchmarks' arguments."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONF, REPO
from hydra import compose, initialize_config_dir
from robustness_helpers import TINY, assert_untouched, fingerprint

import sweep as sweep_script
from gru_experiments.errors import UserError
from gru_experiments.runs import sampling
from gru_experiments.runs.checks import check_precision
from gru_experiments.runs.run_dir import find_checkpoint
from gru_experiments.runs.sample_checks import validate_sample
from gru_experiments.runs.stopping import check_settings

# --- sweep.py -------------------------------------------------------------------------------------------------------


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


# --- early stopping -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("early_stopping.mode=max", "early_stopping.mode=max with early_stopping.monitor=val/loss: a loss improves as it "
                                "falls"),
    ("+early_stopping.check_on_train_epoch_end=abc", "invalid early_stopping.check_on_train_epoch_end='abc': must be "
                                                     "false"),
    ("+early_stopping.check_on_train_epoch_end=true", "invalid early_stopping.check_on_train_epoch_end=True"),
    ("+early_stopping.divergence_threshold=abc", "invalid early_stopping.divergence_threshold='abc': must be null "
                                                 "(off) or a number"),
    ("+early_stopping.verbose=maybe", "invalid early_stopping.verbose='maybe': must be true or false"),
    ("+early_stopping.pateince=3", "unknown key early_stopping.pateince: early_stopping (Lightning's EarlyStopping) "
                                   "takes _target_, monitor, min_delta, patience"),
])
def test_early_stopping_keys_are_checked_before_any_work(compose_config, override, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_settings(compose_config(*TINY, "early_stopping.patience=2", override))


def test_early_stopping_settings_without_patience_say_they_do_nothing(compose_config, capsys):
    check_settings(compose_config(*TINY, "early_stopping.min_delta=0.1", "+early_stopping.stopping_threshold=1.5"))
    assert capsys.readouterr().out.strip() == (
        "early_stopping.min_delta=0.1, early_stopping.stopping_threshold=1.5 have no effect: early stopping is off "
        "(early_stopping.patience=null); early_stopping.patience=N turns it on")
    check_settings(compose_config(*TINY, "early_stopping.patience=2", "early_stopping.min_delta=0.1"))
    check_settings(compose_config(*TINY))  # the defaults: nothing to say
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("override", ["early_stopping.monitor=val/bpc", "early_stopping.mode=max"])
def test_a_resume_that_changes_what_early_stopping_watches_is_refused(compose_config, override):
    """Lightning files the stopper's state under its monitor and mode: another of either dropped it silently."""
    from gru_experiments.runs.resume import resumed_config

    saved = compose_config(*TINY, "early_stopping.patience=2")
    key = override.split("=")[0]
    with pytest.raises(UserError, match=f"was trained with {key}='(val/loss|min)', but this command asks for {key}="):
        resumed_config(saved, compose_config(*TINY, "early_stopping.patience=2", override), ["resume=RUN", override])


# --- trainer.precision ----------------------------------------------------------------------------------------------


def test_float16_weights_for_adamw_are_refused_with_the_reason(compose_config):
    """16-true on a CPU "diverged ... try a lower model.lr", even at 1e-6: AdamW's eps is 0 in float16."""
    with pytest.raises(UserError, match=r"^trainer.precision=16-true keeps the weights and AdamW's state in float16, "
                                        r"where AdamW's eps \(1e-8\) is 0"):
        check_precision(compose_config("trainer.precision=16-true", "model.lr=1e-6"), trained=True)
    check_precision(compose_config("model=ngram2", "trainer.precision=16-true"), trained=False)  # counted: no AdamW
    check_precision(compose_config("trainer.precision=16-mixed"), trained=True)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine installed")
@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_transformer_engine_precision_without_its_package_is_refused(compose_config, precision):
    with pytest.raises(UserError, match=f"^trainer.precision={precision} needs NVIDIA's Transformer Engine, and the "
                                        "transformer_engine package is not installed"):
        check_precision(compose_config(f"trainer.precision={precision}"), trained=True)


def test_more_streams_than_validation_targets_are_refused_in_training(compose_config):
    from gru_experiments.models.protocol import meta_model
    from gru_experiments.runs.checks import check_sizes, validate

    spec = validate(compose_config(*TINY, "evaluation.streams=2000"))
    model = meta_model(spec.architecture)
    with pytest.raises(UserError, match=r"^evaluation.streams=2,000 is not below the validation split's 1,999 targets: "
                                        "each stream would hold one target"):
        check_sizes(spec, model, 18_000, 2_000)
    check_sizes(validate(compose_config(*TINY, "evaluation.streams=1998")), model, 18_000, 2_000)


# --- sample.py ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_corpus):
    """A two-step Astra-α run, and a copy of it in a second run folder."""
    from gru_experiments.runs.training import train

    root = tmp_path_factory.mktemp("answered")
    run = root / "outputs" / "runs" / "astra_alpha" / "run1"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            f"paths.output_dir={run}", f"paths.data_dir={root / 'data'}", f"paths.log_dir={root / 'outputs'}",
            f"data.path={tiny_corpus}", *TINY, "trainer.max_steps=2", "model.steps_per_epoch=2",
            "evaluation.budget=0.01", "evaluation.samples.chars=20"])
    train(cfg)
    shutil.copytree(run, run.with_name("run2"))
    return root, run, run.with_name("run2")


def sample_config(root: Path, tiny_corpus, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="sample", overrides=[
            f"paths.log_dir={root / 'outputs'}", f"paths.data_dir={root / 'data'}",
            f"paths.output_dir={root / 'samples'}", f"data.path={tiny_corpus}", "data.seq_len=32", "device=cpu",
            "prompt=JUAN", "max_new_tokens=5", *overrides])


@pytest.fixture
def latin1(tmp_path) -> Path:
    path = tmp_path / "latin1.txt"
    path.write_bytes("JUAN: caf\xe9\n".encode("latin-1"))
    return path


NO_GPU = "torch sees no CUDA GPU on this machine" if not torch.cuda.is_available() else None


@pytest.mark.parametrize("overrides, message", [
    (["device=banana"], "device=banana: not a device: give auto (a GPU where there is one), cpu, cuda, cuda:N or mps"),
    pytest.param(["device=cuda"], f"device=cuda: {NO_GPU}", marks=pytest.mark.skipif(NO_GPU is None, reason="a GPU")),
    (["cpu_threads=-3"], "invalid cpu_threads=-3: must be null (torch's default) or an integer >= 1"),
    (["cpu_threads=abc"], "invalid cpu_threads='abc': must be null (torch's default) or an integer >= 1"),
    (["prompt=[]"], "prompt=[] gives no prompt to sample from"),
    (["~prompt", "prompt_file={latin1}"], "prompt_file={latin1} is not UTF-8 text: byte 0xe9 at offset 9, line 1; "
                                         "convert it first, e.g. iconv -f latin1 -t utf-8"),
    (["explore=true", "explore_file={latin1}"], "explore_file={latin1} is not UTF-8 text: byte 0xe9 at offset 9"),
    (["ckpt={run2}/checkpoints/last.ckpt"], "ckpt={run2}/checkpoints/last.ckpt is a checkpoint of the run {run2}, "
                                            "but run={run1} names another run: give one of them"),
    (["evaluate=true", "evaluation.streams=100000"], "evaluation.streams=100,000 is not below the validation split's "
                                                     "1,999 targets"),
    # issue 72: sample.py took windows train.py refuses (its bar then read "600M tokens"); a folder as the prompts
    (["evaluate=true", "evaluation.window=1999"], "evaluation.window=1,999 is not shorter than the validation split "
                                                  "(1,999 targets): no target has that much context before it"),
    (["explore=true", "evaluation.window=100000"], "evaluation.window=100,000 is not shorter than the validation"),
    (["~prompt", "prompt_file={run2}"], "prompt_file={run2} is a directory: give a UTF-8 text file"),
])
def test_sample_py_settings_it_cannot_use_get_one_line_before_any_output(two_runs, tiny_corpus, latin1, overrides,
                                                                        message):
    root, run1, run2 = two_runs
    names = {"latin1": latin1, "run1": run1, "run2": run2}
    cfg = sample_config(root, tiny_corpus, f"run={run1}", *(o.format(**names) for o in overrides))
    checkpoint = find_checkpoint(cfg.model.name, cfg.paths.log_dir, cfg.ckpt, cfg.run)  # as sample.py finds it
    before = fingerprint(root)
    with pytest.raises(UserError) as refused:
        spec = validate_sample(cfg)  # as sample.py: the settings, then the checkpoint
        (sampling.explore_run if spec.explore else sampling.sample)(spec, checkpoint)
    assert str(refused.value).startswith(message.format(**names))
    assert_untouched(before, fingerprint(root))


def test_the_python_api_takes_the_same_devices(two_runs):
    from gru_experiments import load

    with pytest.raises(UserError, match="^device=banana: not a device"):
        load(two_runs[1], device="banana")


def test_a_device_this_machine_cannot_run_is_answered_in_one_line(monkeypatch):
    """models/devices.resolve_device, the machine's GPUs a stand-in: two CUDA GPUs and no Apple MPS device."""
    from gru_experiments.models.devices import InvalidDevice, resolve_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name, key, reason in (
            ("mps", "device", "no Apple MPS device on this machine; use device=cpu or device=auto"),
            ("cuda:2", "device", "this machine has 2 CUDA GPU(s), cuda:0 to cuda:1"),
            ("meta", "--device", "torch's meta devices are not run here: give auto (a GPU where there is one), cpu, "
                                 "cuda, cuda:N or mps")):
        with pytest.raises(InvalidDevice) as refused:
            resolve_device(name, key)
        assert str(refused.value) == f"{key}={name}: {reason}" and refused.value.reason == reason
    assert resolve_device("cuda:1") == torch.device("cuda:1") and resolve_device(" auto ") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_explore_with_evaluate_and_stats_does_all_three(two_runs, tiny_corpus):
    root, run1, _ = two_runs
    cfg = sample_config(root, tiny_corpus, f"run={run1}", "explore=true", "evaluate=true", "stats=true",
                        "explore_chars=300", "evaluation.budget=0.01", "evaluation.text.samples=1",
                        "evaluation.text.chars=32", "evaluation.text.drift_chars=0")
    record = sampling.explore_run(validate_sample(cfg), run1 / "checkpoints" / "last.ckpt")
    assert record["explore"] == run1 / "explore.html" and record["explore"].is_file()
    assert record["evaluation"]["stateful_bpc"] > 0 and record["text"]["settings"]
    assert {path.name for path in (root / "samples").iterdir()} == {"evaluation.json", "stats.json"}


def test_evaluate_and_explore_refuse_a_corpus_edited_since_the_run_trained_on_it(two_runs, tiny_corpus, tmp_path):
    """Issue 72: sample.py evaluate=true scored an edited corpus with no word, where a resume refuses it."""
    root, run1, _ = two_runs
    edited = tmp_path / "edited.txt"  # the run's corpus, edited since (its text given again as data.path)
    edited.write_text(tiny_corpus.read_text(encoding="utf-8").replace("a", "e"), encoding="utf-8")
    for asked in (["evaluate=true"], ["explore=true"]):
        spec = validate_sample(sample_config(root, edited, f"run={run1}", *asked))
        with pytest.raises(UserError, match=rf"^the corpus changed since astra_alpha trained on it: {edited} has "
                                            r"sha256 \w+, but checkpoint .* was trained on sha256 \w+; its figures "
                                            "would score another text: restore that text$"):
            (sampling.explore_run if spec.explore else sampling.sample)(spec, run1 / "checkpoints" / "last.ckpt")


def test_explore_on_a_run_still_training_is_refused_naming_the_lock(two_runs, tiny_corpus):
    """Issue 72: explore=true wrote explore.html into a training run's locked folder, from a mid-training checkpoint,
    naming no step (a page now names its checkpoint's step)."""
    from gru_experiments.errors import RunFolderTaken
    from gru_experiments.runs.run_dir import RunDir

    root, _, run2 = two_runs
    spec = validate_sample(sample_config(root, tiny_corpus, f"run={run2}", "explore=true", "explore_chars=100"))
    before = fingerprint(run2)
    with RunDir(run2).hold(), pytest.raises(RunFolderTaken, match=rf"^{run2} is in use: another process is training "
                                                                  "in it .* so this command cannot write its "
                                                                  "explore.html from a checkpoint of a run still"):
        sampling.explore_run(spec, run2 / "checkpoints" / "last.ckpt")
    assert_untouched(before, fingerprint(run2))
    page = sampling.explore_run(spec, run2 / "checkpoints" / "last.ckpt")["explore"].read_text(encoding="utf-8")
    assert "last.ckpt (step 2)" in page


def test_model_beside_run_is_named_as_ignored(two_runs, tiny_corpus, monkeypatch, capsys):
    """Issue 72: sample.py run=R model=lstm sampled R's model with no word of model=."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    root, run1, _ = two_runs
    cfg = sample_config(root, tiny_corpus, f"run={run1}", "model=lstm")
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(overrides=SimpleNamespace(
        task=[f"run={run1}", "model=lstm"]))))
    validate_sample(cfg)
    assert capsys.readouterr().out.startswith("model=lstm is ignored: run= names the checkpoint, whose own model is "
                                              "sampled")


# --- the benchmarks -------------------------------------------------------------------------------------------------


def benchmark(name: str):
    """benchmarks/<name>.py as a module (its folder on sys.path, as when it runs as a script)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.mark.parametrize("script, arguments, message", [
    ("bench_cache", ["--device", "banana"], "argument --device: not a device: give auto"),
    ("bench_cache", ["--models", "foo"], "argument --models: invalid choice: 'foo'"),
    ("bench_minrnn", ["--device", "banana"], "argument --device: not a device"),
    ("bench_minrnn", ["--windows", "abc"], "argument --windows: must be integers >= 1, comma-separated"),
    ("bench_minrnn", ["--windows", "0"], "argument --windows: must be integers >= 1"),
    ("bench_minrnn", ["--scan-lengths", "-3"], "argument --scan-lengths: must be integers >= 1"),
    ("bench_minrnn", ["--scan-lengths", "8,,16"], "argument --scan-lengths: must be integers >= 1"),
    ("bench_batching", ["--model", "foo"], "argument --model: no model 'foo' in conf/model/: give one of astra_alpha"),
    ("bench_batching", ["--model", "ngram2"], "argument --model: ngram2 is a counted model"),
    ("bench_gpu", ["--device", "banana"], "argument --device: not a device"),
    ("bench_gpu", ["--device", "cpu", "--models", "foo"], "argument --models: no model 'foo'"),
    ("bench_gpu", ["--device", "cpu", "--models", "ngram2"], "argument --models: ngram2 is a counted model"),
    ("bench_gpu", ["--device", "cpu", "--models", "transformer"], "argument --models: transformer is no GRU or LSTM"),
    ("bench_gpu", ["--device", "cpu", "--steps", "0"], "argument --steps: must be an integer >= 1"),
    pytest.param("bench_gpu", [], f"argument --device: {NO_GPU}",
                 marks=pytest.mark.skipif(NO_GPU is None, reason="a GPU")),
])
def test_a_benchmark_argument_it_cannot_use_gets_one_line(script, arguments, message, monkeypatch, capsys):
    module = benchmark(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *arguments])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {script}.py: {message}"), lines
