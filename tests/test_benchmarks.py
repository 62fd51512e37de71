"""Every script under benchmarks/ runs, in a smoke mode, so that none breaks unnoticed (issue 53: bench_peak.py failed
on every invocation, reading a model config that extends its base as plain YAML). gpu_study.sh and gpu_jobs.py, the
GPU scripts, run on the CPU in tests/test_gpu_study.py. An argument a benchmark cannot use gets one line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from robustness_helpers import NO_GPU, REPO

BENCHMARKS = REPO / "benchmarks"
ONE_THREAD = ["--threads", "1"]

# script, its smoke-mode arguments ({corpus}: a tiny corpus, {data}: a tokenizer cache), what its output shows
SMOKE = [
    ("bench_peak.py", ["--quick", *ONE_THREAD], "| astra_alpha |"),
    ("bench_recurrence.py", ["--quick", "--models", "astra_alpha", "--steps", "1", "--batch", "4", "--seq-len", "16",
                             "--lengths", "2,4", "--sample-repeats", "1", *ONE_THREAD], "Stateful sampling"),
    ("bench_batching.py", ["--quick", *ONE_THREAD], "streams / windows per round"),
    ("bench_minrnn.py", ["--quick", *ONE_THREAD], "One minGRU layer"),
    ("bench_sampling.py", ["--quick", *ONE_THREAD], "windowed"),
    ("bench_evaluation.py", ["--quick", "--data-dir", "{data}", "data.path={corpus}"], "| astra_alpha |"),
    ("transformer_early_lr.py", ["--quick"], "validation bpc"),
    ("bench_smoke.py", ["--quick", "--data-dir", "{data}"], "| astra_alpha |"),
    ("bench_gpu.py", ["--device", "cpu", "--quick", "--models", "astra_alpha"], "graphed / eager"),
    ("bench_cache.py", ["--device", "cpu", "--quick"], "the cache (N = 128.."),
    ("bench_dynamic.py", ["--quick", *ONE_THREAD], "| astra_alpha | 64 |"),
    pytest.param("bench_inputs.py", ["--quick"], "exit 2", marks=pytest.mark.slow),  # three train.py runs, ~40 s
    ("bench_scale.py", ["--quick", "--work-dir", "{data}/bench_scale"], "| 0.2 MB |"),
]


def every_script() -> set[str]:
    return {path.name for path in BENCHMARKS.iterdir() if path.suffix in (".py", ".sh")}


def test_every_benchmark_script_has_a_smoke_test():
    tested = {case.values[0] if hasattr(case, "values") else case[0] for case in SMOKE}
    # tests/test_gpu_study.py runs those (gpu_check.sh: GPU only, its refusal on a CPU)
    assert every_script() - tested == {"gpu_study.sh", "gpu_jobs.py", "gpu_check.sh"}


@pytest.mark.parametrize("script, arguments, shows", SMOKE)
@pytest.mark.slow
def test_a_benchmark_runs_in_its_smoke_mode(script, arguments, shows, tiny_corpus, data_dir, tmp_path):
    arguments = [a.replace("{corpus}", str(tiny_corpus)).replace("{data}", str(data_dir)) for a in arguments]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PROJECT_ROOT=str(tmp_path),
               WANDB_MODE="offline", WANDB_SILENT="true")
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *arguments], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert shows in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("script", ["bench_peak.py", "bench_recurrence.py", "bench_batching.py", "bench_minrnn.py",
                                    "bench_sampling.py", "bench_smoke.py"])
@pytest.mark.slow
def test_threads_below_one_are_refused_in_one_line(script):
    """--threads -1 was torch's RuntimeError with a traceback."""
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--threads", "-1"], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--threads" in lines[0] and ">= 1" in lines[0], result.stderr


def test_load_shapes_reads_a_variant_that_extends_its_base():
    """bench_recurrence.load_shapes composes each model config as train.py does (astra_alpha_original extends
    astra_alpha: its architecture is the base's)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_recurrence import load_shapes
    finally:
        sys.path.remove(str(BENCHMARKS))
    shapes = load_shapes(["astra_alpha", "astra_alpha_original", "scribe_alpha"])
    assert shapes["astra_alpha_original"].hidden_size == shapes["astra_alpha"].hidden_size
    assert shapes["scribe_alpha"].vocab_size == 1000 and shapes["astra_alpha"].vocab_size == 65


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
