"""How a run's cost grows with its corpus: Astra-α, `trainer.max_steps=20`, on Tiny Shakespeare repeated to each size.

    OMP_NUM_THREADS=1 python benchmarks/bench_scale.py --sizes 1,10,100           # MB; 1000 for the gigabyte
    python benchmarks/bench_scale.py --quick                                      # a smoke run: 0.2 MB, 2 steps

Per size, two runs of train.py, each its own process: the first prepares the corpus's token ids
(data/token_ids.py), the second maps them as every later run does. The table: the first run's preparation (its
printed line), the later run's wall time, its time before the first step (the process's wall time, Python's imports
included, less training and the evaluation), its peak resident memory (the process's, from wait4; beside it the
peak of its anonymous part, RssAnon: the resident set less the mapped ids' pages), the end-of-run
evaluation's time against the estimate the run printed, and the training tokens per second. The corpora are written
under --work-dir and deleted after (a gigabyte's ids and text are 2 GB). --repo measures another checkout's train.py
(the code before a change: its runs prepare nothing, so the first two columns say what every run pays).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from gru_experiments.data.corpus import read_corpus

ROOT = Path(__file__).resolve().parents[1]
PREPARED = re.compile(r"prepared the token ids of .* in ([\d.]+) s")
ESTIMATE = re.compile(r"end-of-run evaluation ([\d.]+ (?:h|min|s)(?: [\d.]+ (?:min|s))?) \(")
UNITS = {"h": 3600, "min": 60, "s": 1}
POLL_SECONDS = 0.05


def seconds_of(duration: str) -> float:
    """study/cost.duration's text read back: "9.5 s", "4 min 05 s", "1 h 02 min"."""
    parts = duration.split()
    return sum(float(value) * UNITS[unit] for value, unit in zip(parts[::2], parts[1::2]))


def write_corpus(path: Path, megabytes: float) -> None:
    """Tiny Shakespeare repeated (cut at a line end) to about `megabytes` MB."""
    text = read_corpus(ROOT / "gru_experiments" / "data" / "corpora" / "tinyshakespeare.txt.xz").encode()
    size = int(megabytes * 1e6)
    with open(path, "wb") as f:
        written = 0
        while written < size:
            part = text[:size - written]
            f.write(part)
            written += len(part)


def run(corpus: Path, work: Path, steps: int, name: str, repo: Path = ROOT) -> dict:
    """One train.py run: its summary, its output, its wall time and peak RSS (wait4's, the process alone)."""
    out = work / name
    command = [sys.executable, "train.py", f"data.path={corpus}", f"trainer.max_steps={steps}", "logger=none",
               f"paths.log_dir={out}", f"paths.data_dir={work / 'data'}", "trainer.enable_progress_bar=false"]
    started = time.perf_counter()
    with open(work / f"{name}.log", "w") as log:
        process = subprocess.Popen(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT)
        anonymous = AnonymousPeak(process.pid)
        _, status, usage = os.wait4(process.pid, 0)
        anonymous.stop()
    wall = time.perf_counter() - started
    text = (work / f"{name}.log").read_text()
    if status != 0:
        raise SystemExit(f"{name} failed (status {status}): see {work / f'{name}.log'}\n{text[-2000:]}")
    summary = json.loads(next(out.rglob("summary.json")).read_text())
    return {"summary": summary, "log": text, "wall": wall, "peak_gb": usage.ru_maxrss * 1024 / 1e9,
            "anonymous_gb": anonymous.peak / 1e9}


class AnonymousPeak:
    """The process's peak anonymous memory (/proc/PID/status RssAnon, read every POLL_SECONDS): its resident set
    less the pages of files it maps (the prepared ids, which the kernel drops and reads again under pressure)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.done = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        while not self.done.wait(POLL_SECONDS):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            found = re.search(r"RssAnon:\s+(\d+) kB", status)
            if found:
                self.peak = max(self.peak, int(found[1]) * 1024)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def measure(megabytes: float, work: Path, steps: int, repo: Path = ROOT) -> dict:
    corpus = work / f"corpus_{megabytes:g}MB.txt"
    write_corpus(corpus, megabytes)
    first = run(corpus, work, steps, f"first_{megabytes:g}", repo)
    later = run(corpus, work, steps, f"later_{megabytes:g}", repo)
    summary = later["summary"]
    prepared = PREPARED.search(first["log"])
    estimate = ESTIMATE.search(later["log"])
    corpus.unlink()
    shutil.rmtree(work / "data", ignore_errors=True)
    return {"MB": megabytes, "prepare_s": float(prepared[1]) if prepared else None, "first_wall_s": first["wall"],
            "first_peak_gb": first["peak_gb"], "later_wall_s": later["wall"], "later_peak_gb": later["peak_gb"],
            "first_anonymous_gb": first["anonymous_gb"], "later_anonymous_gb": later["anonymous_gb"],
            "before_first_step_s": later["wall"] - summary["train_seconds"] - summary["eval_seconds"],
            "eval_s": summary["eval_seconds"], "eval_estimate_s": seconds_of(estimate[1]) if estimate else None,
            "tokens_per_s": summary["tokens_per_second"]}


def cell(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    lines = ["| corpus | first run: preparation | first run: wall, peak RSS (anonymous) | later run: wall | later "
             "run: before the first step | later run: peak RSS (anonymous) | end-of-run evaluation (estimate) | "
             "training tokens/s |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['MB']:g} MB | {cell(r['prepare_s'], '.1f')} s | {r['first_wall_s']:.1f} s, "
                     f"{r['first_peak_gb']:.2f} GB ({r['first_anonymous_gb']:.2f}) | {r['later_wall_s']:.1f} s | "
                     f"{r['before_first_step_s']:.1f} s | {r['later_peak_gb']:.2f} GB ({r['later_anonymous_gb']:.2f}) "
                     f"| {r['eval_s']:.1f} s ({cell(r['eval_estimate_s'], '.1f')} s) | {r['tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,100", help="corpus sizes in MB, comma-separated (1000: 1 GB)")
    parser.add_argument("--steps", type=int, default=20, help="trainer.max_steps of each run")
    parser.add_argument("--work-dir", default="/tmp/bench_scale", help="where the corpora and runs go (deleted)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose train.py runs (default: this)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.2 MB, 2 steps")
    args = parser.parse_args()
    sizes, steps = ([0.2], 2) if args.quick else ([float(s) for s in args.sizes.split(",")], args.steps)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"Astra-α, trainer.max_steps={steps}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"{os.cpu_count()} CPUs")
    rows = []
    try:
        for megabytes in sizes:
            rows.append(measure(megabytes, work, steps, args.repo.resolve()))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))


if __name__ == "__main__":
    main()
