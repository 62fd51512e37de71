"""Train one model: python train.py [model=astra_alpha] [key=value ...]; -m for multirun sweeps.

Resume an interrupted run with resume=last (the newest run of the model) or resume=RUN_DIR;
ckpt_path=last and ckpt_path=RUN_DIR mean the same.
"""

import os
import signal
import sys
from pathlib import Path


def _interrupted_while_starting(signum, frame):
    """Ctrl-C (or timeout --signal=INT) before the run started: one line, not a traceback from inside an import."""
    sys.stderr.write("train.py: interrupted (SIGINT) while starting, before training began\n")
    raise SystemExit(130)


signal.signal(signal.SIGINT, _interrupted_while_starting)  # main() hands SIGINT back to Lightning's handling


def _share_busy_cores() -> None:
    """Before torch starts its threads: OpenMP's passive wait (threads that sleep between parallel regions instead
    of spinning: beside a busy process, spinning threads made a step of Astra-alpha fifty times slower, 9.8 s against
    0.18 s at two threads); on a machine whose cores are already busy (the load average), one thread per idle core,
    said in one line. OMP_WAIT_POLICY and OMP_NUM_THREADS set by the user: left as they are."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "OMP_NUM_THREADS" in os.environ or not hasattr(os, "getloadavg"):
        return
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    idle = cores - int(load + 0.25)  # a core counts as busy from a load of 0.75 (a run just ended leaves ~0.5)
    if cores > 1 and idle < cores:
        threads = max(1, idle)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        print(f"train.py: the machine is busy (load average {load:.1f} on {cores} cores): {threads} thread(s) and "
              f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, so that sharing slows the run in proportion; "
              "OMP_NUM_THREADS=N chooses", flush=True)


_share_busy_cores()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from gru_experiments.runs.jobs import job  # noqa: E402

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    # imported here so --help and --cfg stay fast (a SIGINT while torch loads: still the one line above)
    from gru_experiments.runs.distributed import needs_own_process, run_in_own_process
    from gru_experiments.runs.training import train

    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again: Lightning stops gracefully
    with job(cfg, report=True):  # failures: see gru_experiments/runs/jobs.py
        if needs_own_process(cfg):  # DDP in a multirun job: see gru_experiments/runs/distributed.py
            run_in_own_process(cfg, __file__)
        else:
            train(cfg)


if __name__ == "__main__":
    main()
