"""Train one model: python train.py [model=astra_alpha] [key=value ...]; -m for multirun sweeps.

Resume an interrupted run with resume=last (the newest run of the model) or resume=RUN_DIR;
ckpt_path=last and ckpt_path=RUN_DIR mean the same.
"""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from gru_experiments.runs.jobs import job

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
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
