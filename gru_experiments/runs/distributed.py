"""DDP inside a Hydra multirun: Lightning starts ranks 1..N-1 by re-running the command line, which in a multirun
job is the whole sweep, so such a job runs itself as a single run in a child process (SLURM's or torchrun's need not).
"""

import os
import subprocess
import sys
from pathlib import Path

from gru_experiments.runs.loggers import multirun_sweep_dir, sweep_group
from gru_experiments.runs.run_dir import RunDir


def needs_own_process(strategy) -> bool:
    """A multirun job whose trainer.strategy would start DDP ranks by re-running the script."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    strategy = str(strategy or "auto")
    script_launched_ddp = strategy.startswith("ddp") and not any(
        kind in strategy for kind in ("spawn", "fork", "notebook"))
    started_externally = "LOCAL_RANK" in os.environ or SLURMEnvironment.detect() or TorchElasticEnvironment.detect()
    return script_launched_ddp and multirun_sweep_dir() is not None and not started_externally


def run_in_own_process(script: str, logger: dict | None) -> dict:
    """This multirun job's summary, run in a child process; a failed child raises (the job around this records it)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    command = [sys.executable, str(Path(script).resolve()), *hydra_cfg.overrides.task,
               f'hydra.run.dir="{output_dir}"',
               f"hydra.job.num={hydra_cfg.job.num}"]  # in the .hydra/ it records: the job's place in the sweep
    if logger and "group" in logger:  # keep the sweep's W&B group in the single run
        command.append(f'logger.group="{sweep_group(logger["group"], multirun_sweep_dir())}"')
    print(f"DDP in a multirun job: training in a child process: {' '.join(command)}", flush=True)
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        raise RuntimeError(f"the training process of {output_dir} exited with code {code}")
    return RunDir(output_dir).summary()
