"""Train one model: python train.py [model=astra_alpha] [key=value ...]; -m for multirun sweeps."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    # imported here so --help and --cfg stay fast
    from gru_experiments.distributed import needs_own_process, run_in_own_process
    from gru_experiments.training import train

    if needs_own_process(cfg):  # DDP in a multirun job: see gru_experiments/distributed.py
        run_in_own_process(cfg, __file__)
    else:
        train(cfg)


if __name__ == "__main__":
    main()
