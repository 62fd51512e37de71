"""DDP inside a Hydra multirun.

Lightning's DDP (strategy=ddp) starts ranks 1..N-1 by running the script again with the
command line of the *current process*. For a Hydra multirun job that command line is the
whole sweep (`-m model=a,b,c ...`): every extra rank would start the sweep over, into the
wrong folder. So a multirun job that would start its own DDP ranks runs itself as a plain
single run in a child process, `train.py <this job's overrides> hydra.run.dir=<job folder>`,
whose command line Lightning can repeat. Ranks started by SLURM (e.g. the submitit
launcher) or torchrun are started from outside and need none of this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from gru_experiments.runs.jobs import job
from gru_experiments.runs.loggers import multirun_sweep_dir, sweep_group
from gru_experiments.runs.run_dir import RunDir


def ranks_started_externally() -> bool:
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return "LOCAL_RANK" in os.environ or SLURMEnvironment.detect() or TorchElasticEnvironment.detect()


def needs_own_process(cfg: DictConfig) -> bool:
    """A multirun job whose Trainer would start DDP ranks by re-running the script."""
    strategy = str(cfg.trainer.get("strategy", "auto"))
    script_launched_ddp = strategy.startswith("ddp") and not any(
        kind in strategy for kind in ("spawn", "fork", "notebook"))
    return script_launched_ddp and multirun_sweep_dir() is not None and not ranks_started_externally()


def run_in_own_process(cfg: DictConfig, script: str) -> dict:
    """Run this multirun job as `python <script> <job overrides> hydra.run.dir=<job folder>`;
    return its summary. A failed child raises here, inside jobs.job, which leaves the job's
    failure record (the child ran as a single run, which records none), and Hydra marks the
    job failed."""
    from hydra.core.hydra_config import HydraConfig

    with job(cfg, record=True):
        return _run_child(cfg, script, HydraConfig.get())


def _run_child(cfg: DictConfig, script: str, hydra_cfg) -> dict:
    output_dir = Path(hydra_cfg.runtime.output_dir)
    command = [sys.executable, str(Path(script).resolve()), *hydra_cfg.overrides.task,
               f'hydra.run.dir="{output_dir}"',
               "hydra.output_subdir=null"]  # the multirun already wrote this job's .hydra/
    logger_cfg = cfg.get("logger")
    if logger_cfg and "group" in logger_cfg:  # keep the sweep's W&B group in the single run
        command.append(f'logger.group="{sweep_group(logger_cfg.group, multirun_sweep_dir())}"')
    print(f"DDP in a multirun job: training in a child process: {' '.join(command)}", flush=True)
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        raise RuntimeError(f"the training process of {output_dir} exited with code {code}")
    return RunDir(output_dir).summary()
