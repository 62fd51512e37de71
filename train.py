"""Train one model: python train.py [model=astra_alpha] [key=value ...]; -m for multirun sweeps."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from gru_experiments.training import train  # imported here so --help and --cfg stay fast

    train(cfg)


if __name__ == "__main__":
    main()
