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

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from gru_experiments.runs.jobs import job  # noqa: E402

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again: Lightning stops gracefully
    with job(cfg, report=True):  # failures: see gru_experiments/runs/jobs.py
        # imported here so --help and --cfg stay fast
        from gru_experiments.runs.distributed import needs_own_process, run_in_own_process
        from gru_experiments.runs.training import train

        if needs_own_process(cfg):  # DDP in a multirun job: see gru_experiments/runs/distributed.py
            run_in_own_process(cfg, __file__)
        else:
            train(cfg)


if __name__ == "__main__":
    main()
