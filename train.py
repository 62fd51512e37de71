"""Train one model: python train.py [model=astra_alpha] [key=value ...]; -m for multirun sweeps.

Resume an interrupted run with resume=last (the newest run of the model) or resume=RUN_DIR;
ckpt_path=last and ckpt_path=RUN_DIR mean the same.
"""

import os
import signal
import sys
import time
from pathlib import Path


def _interrupted_while_starting(signum, frame):
    """Ctrl-C (or timeout --signal=INT) before the run started: one line, not a traceback from inside an import."""
    sys.stderr.write("train.py: interrupted (SIGINT) while starting, before training began\n")
    sys.stderr.flush()
    # Nothing is written yet; an exception raised into a half-done import (numpy's, say) could be caught there
    # and leave a broken module behind, so: out at once.
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted_while_starting)  # main() hands SIGINT back to Lightning's handling


def _busy_cores(cores: int) -> float:
    """How many cores other processes keep busy now: /proc/stat's busy share over a quarter of a second (this
    process sleeps meanwhile); elsewhere the 1-minute load average."""
    def sample():
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all
    try:
        idle_a, all_a = sample()
        time.sleep(0.25)
        idle_b, all_b = sample()
        return cores * (1 - (idle_b - idle_a) / max(all_b - all_a, 1))
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _share_busy_cores() -> None:
    """Before torch starts its threads: on a machine whose cores other processes keep busy, one thread per idle core
    and OpenMP's passive wait (threads that sleep between parallel regions: spinning threads beside a busy process
    made a step of Astra-alpha fifty times slower, 9.8 s against 0.18 s at two threads), said in one line. An idle
    machine keeps torch's defaults (every core, OpenMP's own wait: passive waiting made a quiet run's small
    per-step matmuls slower at two threads than at one). OMP_NUM_THREADS set by the user: left as it is."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    cores = os.cpu_count() or 1
    busy = int(_busy_cores(cores) + 0.25)  # a core counts as busy from three quarters of its time
    if cores > 1 and busy >= 1:
        threads = max(1, cores - busy)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        print(f"train.py: {busy} of the {cores} cores are busy with other work: {threads} thread(s) and "
              f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, so that sharing slows the run in proportion; "
              "OMP_NUM_THREADS=N chooses", flush=True)


_share_busy_cores()

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from gru_experiments.runs.jobs import job  # noqa: E402

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    # imported here so --help and --cfg stay fast (a SIGINT while torch loads: still the one line above)
    from gru_experiments.runs.distributed import needs_own_process, run_in_own_process
    from gru_experiments.runs.sweep_dir import completed_job
    from gru_experiments.runs.training import train

    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again: Lightning stops gracefully
    with job(cfg, record=True, report=True) as current:  # the run's one job: failures, gru_experiments/runs/jobs.py
        if completed_job(cfg) is not None:  # a continued sweep's job that completed before (a DDP one included)
            print(f"{cfg.paths.output_dir}: this job completed before (its summary.json): left as it is")
        elif needs_own_process(cfg.trainer.get("strategy")):  # DDP in a multirun job: runs/distributed.py
            # its failure recorded here (the child, a single run, records none)
            logger = OmegaConf.to_container(cfg.logger, resolve=True) if cfg.get("logger") else None
            run_in_own_process(__file__, logger)
        else:
            train(cfg, current)


if __name__ == "__main__":
    from gru_experiments.runs.jobs import command_line

    with job(argv=sys.argv, report=True):  # ~/ expanded, a value Hydra's lexer refuses: one line (runs/jobs.py)
        sys.argv = command_line(sys.argv)
    main()
