"""Many small train.py runs side by side on one CUDA device, with a deadline: the device jobs of the
minGRU/minLSTM rung, the LSTM's memory horizon and the planted-recall experiment (docs/results.md).

    python benchmarks/gpu_jobs.py                          # everything below, 14 at a time, stopped at 570 s
    python benchmarks/gpu_jobs.py --only lr --jobs 4       # one group
    python benchmarks/gpu_jobs.py --only lstm              # the LSTM's learning-rate runs, then its recall pairs
    python benchmarks/gpu_jobs.py --accelerator cpu --steps 2 --jobs 2   # the plumbing on a CPU (a smoke run)
    python benchmarks/gpu_jobs.py --only lstm --accelerator cpu --steps 2 preset=smoke data.path=FILE  # overrides

The groups, each a folder under outputs/multiruns/ that `python sweep.py report=<folder>` reports:
- lr_min: minGRU, minLSTM and the hand-written LSTM (`lstm`) at Astra-α's size, every learning rate of the GRU's
  sweep at α (1e-3 to 2e-2), the full recipe, evaluation.text.samples=0, as
  `python sweep.py models=[mingru,minlstm,lstm] 'model.lr=...'` runs it;
- recall_horizon: the experiment set `recall_horizon` with probe=recall and probe=none (each run beside its
  twin); minGRU's, minLSTM's and the LSTM's α runs start once their family's learning-rate runs have ended, at its
  best rate (stateful bits per character), so each is tuned the way the GRU was before it is compared. The LSTM's
  β pairs (recall_lstm_beta_*) run at Astra-β's recipe and rate (2e-3, not swept, as Astra-β's was not) from the
  start, beside Astra-β's.

Small recurrent models are bound by kernel launches, not by the GPU's arithmetic, so a GPU is best used by many
processes at once (one CPU thread each). Not `sweep.py hydra/launcher=parallel`: a device lease needs a
deadline that leaves resumable checkpoints, and the recall runs wait for their family's best rate. A run still
going at the deadline is stopped with SIGINT (it keeps its last.ckpt); a job not started by then is listed as not
run. The same command on the next lease goes on where this one stopped, a folder holding one run: a job that
finished (its summary.json) is skipped, one the deadline cut is resumed from its last.ckpt (`train.py resume=RUN`,
its train.log appended to), one cut before its first checkpoint (nothing to resume) is moved aside to
<root>/cut/<group>/ and started again.
Exit status: the number of jobs that did not complete.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gru_experiments.errors import UserError
from gru_experiments.runs.run_contents import check_run_files
from gru_experiments.runs.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
ACCELERATORS = ("gpu", "cuda", "cpu", "auto")  # Lightning's names for the machines this script runs on
RATES = ("1e-3", "2e-3", "3e-3", "5e-3", "1e-2", "2e-2")
MINIMAL = ("mingru", "minlstm")
TUNED = (*MINIMAL, "lstm")  # the families tuned at α over RATES, then compared on the recall probe at their best
GRU_RECALL = ("recall_beta_windows", "recall_beta_streams", "recall_alpha_windows", "recall_alpha_streams",
              "recall_alpha_long_windows", "recall_transformer_windows")
LSTM_BETA_RECALL = ("recall_lstm_beta_windows", "recall_lstm_beta_streams")  # at Astra-β's rate, not tuned
# A tuned family's recall experiments, run at its best rate
TUNED_RECALL = {"mingru": ("recall_mingru_windows", "recall_mingru_streams"),
                "minlstm": ("recall_minlstm_windows", "recall_minlstm_streams"),
                "lstm": ("recall_lstm_alpha_windows", "recall_lstm_alpha_streams")}



@dataclass
class Job:
    name: str
    folder: Path
    overrides: list[str]
    family: str | None = None  # a learning-rate run of this minimal family
    process: subprocess.Popen | None = None
    started: float | None = None
    ended: float | None = None
    status: str = "waiting"
    log: Path = field(default=None)

    def summary(self) -> dict:
        return RunDir(self.folder).summary() or {}


def lr_jobs(root: Path, families=TUNED) -> list[Job]:
    """Each family at each rate; the folders numbered as in the whole group, whichever families are asked for."""
    return [Job(f"{model}_lr{rate}", root / "lr_min" / f"{i:02d}_{model}_lr{rate}",
                [f"model={model}", f"model.lr={rate}", "evaluation.text.samples=0"], family=model)
            for i, (model, rate) in enumerate((m, r) for m in TUNED for r in RATES) if model in families]


def recall_jobs(root: Path, experiments, first: int, extra: list[str] = ()) -> list[Job]:
    return [Job(f"{experiment}_{probe}", root / "recall_horizon" / f"{first + i:02d}_{experiment}_{probe}",
                [f"experiment={experiment}", f"probe={probe}", *extra])
            for i, (experiment, probe) in enumerate((e, p) for e in experiments for p in ("recall", "none"))]


def best_rate(jobs: list[Job], family: str) -> str | None:
    scored = [(job.summary().get("stateful_bpc"), job.overrides[1].split("=")[1])
              for job in jobs if job.family == family and job.summary().get("status") == "completed"]
    scored = [(bpc, rate) for bpc, rate in scored if isinstance(bpc, float)]
    return min(scored)[1] if scored else None


def start(job: Job, new_run: list[str], resume_with: list[str], env: dict) -> str | None:
    """Start the job's train.py, its output appended to its train.log; a folder holds one run (docs/robustness.md):
    resumed where the run in it was cut (its last.ckpt, no summary.json, `resume_with` this command's accelerator and
    steps), afresh where it holds none (a run cut before its first checkpoint is moved aside first: `move_aside`).
    What it did, or None where it started nothing: the job finished (its status read from its summary.json), or
    another process trains in its folder."""
    run = RunDir(job.folder)
    if run.summary_file.is_file():
        job.status = job.summary().get("status", "unreadable summary.json")
        return None
    if run.checkpoint.is_file():
        command, did = [f"resume={job.folder}", *resume_with], "resumed from its last.ckpt"
    else:
        if run.holds_run() and not move_aside(job):
            return None
        command, did = [*job.overrides, *new_run, f"hydra.run.dir={job.folder}"], "started"
    job.folder.mkdir(parents=True, exist_ok=True)
    job.log = job.folder / "train.log"
    with job.log.open("a") as log:
        job.process = subprocess.Popen([sys.executable, "train.py", *command], cwd=REPO, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
    job.started, job.status = time.monotonic(), "running"
    return did


def move_aside(job: Job) -> bool:
    """A run cut before its first checkpoint has nothing to resume: its folder moves to <root>/cut/<group>/<name>_<time>
    (nothing deleted, and out of the group's sweep report), so that the job starts afresh. False, said in a line,
    where another process trains in it."""
    aside = job.folder.parents[1] / "cut" / job.folder.parent.name / f"{job.folder.name}_{datetime.now():%Y%m%d_%H%M%S}"
    try:
        with RunDir(job.folder).hold("move it aside"):
            aside.parent.mkdir(parents=True, exist_ok=True)
            job.folder.rename(aside)
    except UserError as error:
        job.status = "in use"
        print(f"gpu_jobs.py: {job.name}: {error}", flush=True)
        return False
    print(f"gpu_jobs.py: {job.name} was cut before its first checkpoint (nothing to resume): moved to {aside}; "
          "it starts again", flush=True)
    return True


def parse_arguments(argv) -> argparse.Namespace | None:
    """The arguments, or None (said in one line) where --jobs or --steps is below 1 or the accelerator unusable."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=14, help="runs at once")
    p.add_argument("--deadline", type=float, default=570, help="seconds from start: running jobs get SIGINT")
    p.add_argument("--only", choices=("lr", "recall", "minimal", "lstm"), default=None,
                   help="lr: the learning-rate runs (every tuned family); recall: the GRU and transformer pairs; "
                        "minimal: minGRU's and minLSTM's learning-rate runs, then their recall pairs; lstm: the "
                        "LSTM's learning-rate runs, then its recall pairs (α at its best rate, β beside Astra-β's)")
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--steps", type=int, default=None,
                   help="trainer.max_steps for every run, >= 1 (a smoke run); left out: each recipe's own")
    p.add_argument("--root", type=Path, default=REPO / "outputs" / "multiruns")
    p.add_argument("overrides", nargs="*", help="train.py overrides for every run (preset=smoke data.path=FILE)")
    args = p.parse_args(argv)
    for flag, value in (("--jobs", args.jobs), ("--steps", args.steps)):
        if value is not None and value < 1:
            print(f"gpu_jobs.py: {flag} {value}: must be an integer >= 1"
                  + (" (leave --steps out for each recipe's own steps)" if flag == "--steps" else ""), file=sys.stderr)
            return None
    if not args.deadline > 0:  # 0 or less ran nothing and listed every job "not run", saying nothing of the deadline
        print(f"gpu_jobs.py: --deadline {args.deadline:g}: must be a number of seconds > 0 (from the start; running "
              "jobs then get SIGINT)", file=sys.stderr)
        return None
    if args.root.exists() and not args.root.is_dir():
        print(f"gpu_jobs.py: --root {args.root}: not a folder: give the folder the job groups go under (default "
              "outputs/multiruns)", file=sys.stderr)
        return None
    if (problem := accelerator_problem(args.accelerator)) is not None:
        print(f"gpu_jobs.py: --accelerator {args.accelerator}: {problem}", file=sys.stderr)
        return None
    return args


def accelerator_problem(accelerator: str) -> str | None:
    """Why the jobs could not run on `accelerator` here, checked before any job starts (as gpu_study.sh does)."""
    if accelerator not in ACCELERATORS:
        return f"not an accelerator: give one of {', '.join(ACCELERATORS)}"
    import torch

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False): this script is for a GPU (--accelerator cpu: " \
               "the plumbing on a CPU)"
    return None


def planned(args) -> tuple[list[Job], dict[str, bool]]:
    """The jobs in the order they start, and the families whose recall pairs wait for their best rate."""
    families = {None: TUNED, "lr": TUNED, "minimal": MINIMAL, "lstm": ("lstm",)}.get(args.only, ())
    lr = lr_jobs(args.root, families)
    queue = recall_jobs(args.root, GRU_RECALL, 0) if args.only in (None, "recall") else []
    beta = recall_jobs(args.root, LSTM_BETA_RECALL, 2 * len(GRU_RECALL)) if args.only in (None, "lstm") else []
    # The longest runs (Astra-β's and its LSTM's) first, then the learning-rate runs, then Astra-α's and the
    # transformer's pairs.
    return queue[:4] + beta + lr + queue[4:], {family: args.only != "lr" for family in families}


def new_run_overrides(args) -> tuple[list[str], list[str]]:
    """What every new job adds to its own overrides, and what a resumed one gives (the rest is the run's own)."""
    new_run = [f"trainer.accelerator={args.accelerator}", "logger=csv", *args.overrides]
    resume_with = [f"trainer.accelerator={args.accelerator}"]  # the rest is the run's own (its .hydra/)
    for steps in ([f"trainer.max_steps={args.steps}"] if args.steps is not None else []):
        new_run, resume_with = [*new_run, steps], [*resume_with, steps]
    return new_run, resume_with


def run_until_deadline(args, queue: list[Job], pending: dict[str, bool]) -> tuple[list[Job], list[Job]]:
    """The jobs, args.jobs at a time, until none is left or the deadline passes: (done, stopped at the deadline)."""
    new_run, resume_with = new_run_overrides(args)
    done: list[Job] = []
    running: list[Job] = []
    start_time = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def say(text: str) -> None:
        print(f"[{time.monotonic() - start_time:6.0f} s] {text}", flush=True)

    while queue or running:
        for job in [job for job in running if job.process.poll() is not None]:
            running.remove(job)
            job.ended = time.monotonic()
            job.status = job.summary().get("status", f"exit {job.process.returncode}")
            done.append(job)
            bpc = job.summary().get("stateful_bpc")
            say(f"{job.name}: {job.status} in {job.ended - job.started:.0f} s"
                + (f", stateful {bpc:.4f}" if isinstance(bpc, float) else "") + f" ({job.log})")
        queue[:0] = recall_pairs_due(args.root, pending, queue + running, done, say)
        if time.monotonic() - start_time > args.deadline:
            break
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            did = start(job, new_run, resume_with, env)
            (running if did else done).append(job)
            if did:
                say(f"{job.name}: {did} ({len(running)} running, {len(queue)} waiting)")
            elif job.status != "in use":
                say(f"{job.name}: finished ({job.status}): skipped")
        time.sleep(2)
    stop(running, say)
    return done, running


def recall_pairs_due(root: Path, pending: dict[str, bool], unfinished: list[Job], done: list[Job], say) -> list[Job]:
    """The recall pairs of each family whose learning-rate runs have all ended, at its best rate."""
    due = []
    for family, waiting in pending.items():
        if waiting and not any(j.family == family for j in unfinished):
            pending[family] = False
            rate = best_rate(done, family)
            if rate is None:
                say(f"{family}: no completed learning-rate run, so no recall runs")
                continue
            say(f"{family}: best rate {rate}; its recall pairs start")
            due += recall_jobs(root, TUNED_RECALL[family], 20 + 4 * TUNED.index(family), [f"model.lr={rate}"])
    return due


def stop(running: list[Job], say) -> None:
    """SIGINT to every job still running (each keeps its last.ckpt for the next lease's resume)."""
    for job in running:
        job.process.send_signal(signal.SIGINT)
    for job in running:
        try:
            job.process.wait(timeout=25)
        except subprocess.TimeoutExpired:
            job.process.kill()
        # a job that finished as the deadline came (its summary says completed) counts as what it is
        job.status = "completed" if job.summary().get("status") == "completed" else "stopped"
        say(f"{job.name}: " + ("completed as the deadline came" if job.status == "completed" else
                               "stopped at the deadline (SIGINT)"))


def print_table(done: list[Job], running: list[Job], queue: list[Job]) -> None:
    print("\n| job | status | stateful bpc | windowed | stateless | seconds |\n|---|---|--:|--:|--:|--:|")
    for job in done + running:
        s = job.summary()
        cells = [f"{s[k]:.4f}" if isinstance(s.get(k), float) else "" for k in
                 ("stateful_bpc", "windowed_bpc", "stateless_bpc")]
        seconds = "" if job.started is None else f"{(job.ended or time.monotonic()) - job.started:.0f}"
        print(f"| {job.name} | {job.status} | " + " | ".join(cells) + f" | {seconds} |")
    for job in queue:
        print(f"| {job.name} | not run | | | | |")


def overrides_problem(jobs: list[Job], new_run: list[str]) -> str | None:
    """Why a job would be refused by train.py, checked before any job starts (each job's config composed as train.py
    composes it, its added keys and values checked as train.py checks them): a bad override (`model.lr=-1`,
    `+colour=red`) once started every job, each failing."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from gru_experiments.runs.checks import check_added_keys, check_choices, validate

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for job in jobs:
            overrides = [*job.overrides, *new_run, f"paths.output_dir={job.folder}"]
            try:
                cfg = compose("train", overrides, return_hydra_config=True)
                check_added_keys(overrides, cfg.hydra.runtime.choices)
                check_choices(overrides)
                with open_dict(cfg):
                    del cfg["hydra"]
                validate(cfg)
            except (UserError, HydraException, OmegaConfBaseException) as error:
                return f"{job.name} (train.py {' '.join(overrides[:-1])}): {' '.join(str(error).split())}"
    return None


def folders_problem(root: Path) -> str | None:
    """Why the job folders a rerun would resume under `root` cannot be, checked before any job starts: a folder that
    names a callable the project does not build from a run folder (runs/run_contents.py)."""
    try:
        for record in sorted(root.glob("*/*/.hydra")):
            check_run_files(record.parent)
    except UserError as error:
        return str(error)
    return None


def main(argv=None) -> int:
    args = parse_arguments(argv)
    if args is None:
        return 2
    if (problem := folders_problem(args.root)) is not None:
        print(f"gpu_jobs.py: {problem}", file=sys.stderr)
        return 2
    queue, pending = planned(args)
    later = [job for family in pending for job in recall_jobs(args.root, TUNED_RECALL[family], 0, ["model.lr=1e-3"])]
    if (problem := overrides_problem(queue + later, new_run_overrides(args)[0])) is not None:
        print(f"gpu_jobs.py: {problem}; no job was started", file=sys.stderr)
        return 2
    done, running = run_until_deadline(args, queue, pending)
    print_table(done, running, queue)
    return sum(job.status != "completed" for job in done + running) + len(queue)


if __name__ == "__main__":
    sys.exit(main())
