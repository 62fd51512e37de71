"""How long `python train.py model=M trainer.fast_dev_run=true` takes, per model (a benchmark, not a test);
with --max-steps N, `python train.py model=M trainer.max_steps=N` on the whole validation split.

    python benchmarks/bench_smoke.py [--models astra_alpha ... leviathan] [--repeats 2] [--threads 1]
    python benchmarks/bench_smoke.py --quick   # a smoke run of the benchmark: Astra-α once
    python benchmarks/bench_smoke.py --max-steps 3 --models transformer transformer_beta \
        nanogpt_shakespeare scribe_gamma leviathan

Each run is a fresh process, as a user runs it: the wall time from start to exit (imports, corpus
and tokenizer, one training step, one validation batch, every inference mode, the context curve,
the samples, summary.json), and from summary.json the run's own seconds, the training step and the
evaluation. The Scribe models train their SentencePiece tokenizer the first time and cache it
(paths.data_dir): the first repeat of a Scribe model is then a cold cache, the others warm. Goal:
every model within 60 s on a 2-core CPU (issue 20); with --max-steps 3, training and evaluation within
90 s, the evaluation bounded by evaluation.budget in proportion to the 3 steps trained (issue 25).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = ["astra_alpha", "astra_beta", "astra_gamma", "scribe_alpha", "scribe_beta", "scribe_gamma", "leviathan",
          "transformer", "transformer_beta", "nanogpt_shakespeare"]


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({os.cpu_count()} cores; {' '.join(shown)})"


def run(model: str, log_dir: Path, data_dir: Path, threads: int, max_steps: int | None = None) -> dict:
    run_dir = log_dir / f"{model}_{time.time_ns()}"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), WANDB_MODE="offline", PROJECT_ROOT=str(REPO))
    started = time.perf_counter()
    length = f"trainer.max_steps={max_steps}" if max_steps else "trainer.fast_dev_run=true"
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"model={model}", length,
                             "logger=none", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}",
                             f"paths.data_dir={data_dir}"], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{model}: exit {result.returncode}\n{result.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["smoke"] is not max_steps
    return {"wall": wall, "run": summary["wall_seconds"], "train": summary["train_seconds"],
            "eval": summary["eval_seconds"], "forward": summary["mode_evaluation"]["forward_tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--quick", action="store_true", help="a smoke run of the benchmark: Astra-α once")
    parser.add_argument("--max-steps", type=int, default=None, help="trainer.max_steps=N instead of fast_dev_run")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="tokenizer cache (default: a fresh temporary folder: cold for the first repeat)")
    args = parser.parse_args()
    if args.threads < 1:
        parser.exit(2, f"error: --threads={args.threads}: must be an integer >= 1\n")
    if args.quick:
        args.models, args.repeats = ["astra_alpha"], 1
    print(f"CPU: {cpu_name()}; OMP_NUM_THREADS={args.threads}; load average at start "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        rows = {model: [] for model in args.models}
        for repeat in range(args.repeats):  # models side by side in each repeat: the load hits all alike
            for model in args.models:
                rows[model].append(run(model, Path(tmp) / "outputs", data_dir, args.threads, args.max_steps))
                r = rows[model][-1]
                print(f"  repeat {repeat + 1} {model}: {r['wall']:.1f} s (run {r['run']:.1f} s, "
                      f"training {r['train']:.1f} s, evaluation {r['eval']:.1f} s)", flush=True)
    goal = 90 if args.max_steps else 60
    print(f"\nload average at end {os.getloadavg()[0]:.1f}\n")
    length = f"trainer.max_steps={args.max_steps}" if args.max_steps else "trainer.fast_dev_run=true"
    print(f"{length}, OMP_NUM_THREADS={args.threads}")
    print(f"| model | wall, each repeat (s) | run within it (s) | training (s) | evaluation (s) | its forward tokens "
          f"| ≤ {goal} s |")
    print("|---|---:|---:|---:|---:|---:|:-:|")
    for model, results in rows.items():
        walls = " / ".join(f"{r['wall']:.1f}" for r in results)
        worst = max(r["wall"] for r in results)
        print(f"| {model} | {walls} | {max(r['run'] for r in results):.1f} | {max(r['train'] for r in results):.1f} "
              f"| {max(r['eval'] for r in results):.1f} | {results[-1]['forward']:,} "
              f"| {'yes' if worst <= goal else 'NO'} |")


if __name__ == "__main__":
    main()
