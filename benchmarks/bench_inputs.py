"""How long each bad or unusual input of issue 36 takes to get its answer (a benchmark, not a test: the tests that
docs/robustness.md's table of inputs names hold what each answer says, most of them in tests/test_checks.py,
tests/test_sample.py and tests/test_resume.py). Goal: one line within 10 s each.

    python benchmarks/bench_inputs.py
    python benchmarks/bench_inputs.py --quick   # a smoke run: the short run and the first two inputs

Each command is a fresh process on the shipped Tiny Shakespeare, as a user runs it, under a temporary
PROJECT_ROOT; the resume inputs use a short run made first, its summary.json removed so that it reads as
interrupted (its checkpoint at step 4 of 8). Prints a row per input: seconds, exit status, the answer's line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHORT = ["logger=csv", "evaluation.text.samples=0", "trainer.enable_progress_bar=false"]
RUN = ["data.batch_size=8", "data.seq_len=32", "model.steps_per_epoch=4", "model.epochs=2", "trainer.max_steps=4",
       "checkpoint.every_n_steps=2", "evaluation.budget=0.1", "evaluation.curve_longest=null", *SHORT]
INPUTS = [
    ["train.py", "resume={run}", "trainer.max_steps=3"],
    ["train.py", "resume={run}", "optim=transformer"],
    ["train.py", "resume={run}", "model.lr=0.5"],
    ["train.py", "resume={run}", "optim.warmup_steps=10"],
    ["train.py", "resume={root}"],
    ["train.py", "resume={run}", "seed=7"],
    ["train.py", "resume={run}", "training=streams"],
    ["train.py", "resume={run}", "experiment=recall_alpha_streams"],
    ["train.py", "evaluation.window=200000", *SHORT],
    ["train.py", "training=long_windows", "data.batch_size=2500", *SHORT],
    ["train.py", "+probe.keys=8", *SHORT],
    ["train.py", "probe=recall", "probe.name=bogus", *SHORT],
    ["train.py", "probe.name=recall", *SHORT],
    ["train.py", "+colour=red", *SHORT],
    ["train.py", "probe=recall", "probe.phases=[{start:0,distances:[2000000],gap:2}]", *SHORT],
    ["sample.py", "run={run}", "+num_chars=0"],
    ["sample.py", "run={run}", "stats=true", "evaluation.text.samples=1000000000"],
    ["sample.py", "run={run}", "stats=true", "evaluation.text.drift_chars=1000000000"],
]


def run(command: list[str], root: Path) -> tuple[float, int, str]:
    env = dict(os.environ, PROJECT_ROOT=str(root), WANDB_MODE="offline", WANDB_SILENT="true")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, str(REPO / command[0]), *command[1:]], cwd=REPO, env=env,
                            capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")] or ["(accepted)"]
    return time.perf_counter() - started, result.returncode, lines[-1]


def main() -> None:
    quick = "--quick" in sys.argv[1:]  # a smoke run of the benchmark: the run and the first two inputs
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        seconds, status, _ = run(["train.py", *RUN], root)
        (interrupted,) = (root / "outputs" / "runs" / "astra_alpha").iterdir()
        (interrupted / "summary.json").unlink()
        print(f"the interrupted run: {seconds:.1f} s, exit {status}")
        for command in INPUTS[:2] if quick else INPUTS:
            command = [part.replace("{run}", str(interrupted)).replace("{root}", str(root)) for part in command]
            seconds, status, line = run(command, root)
            shown = " ".join(command).replace(str(interrupted), "RUN").replace(str(root), "ROOT")
            print(f"{seconds:5.1f} s  exit {status}  {shown}\n          {line[:160]}")


if __name__ == "__main__":
    main()
