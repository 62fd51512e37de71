"""Sample from a trained model: python sample.py [model=astra_alpha] [inference=stateful|stateless|windowed]
[ckpt=PATH | run=RUN_DIR] [prompt="ROMEO: " | prompt_file=FILE] [key=value ...]; see conf/sample.yaml.
python sample.py run=RUN_DIR explore=true writes the run's page instead, explore.html (docs/explore.md)."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gru_experiments.runs.jobs import command_line, discard_untouched_run_dir, job
from gru_experiments.runs.run_dir import find_checkpoint, model_name_for

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
# The output folder is named after the model actually sampled (run=/ckpt= may name another one).
OmegaConf.register_new_resolver("sampled_model", model_name_for, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="sample")
def main(cfg: DictConfig) -> None:
    with job(cfg, report=True):
        # Found before torch is imported, so that a missing checkpoint is reported at once.
        checkpoint = find_checkpoint(cfg.model.name, cfg.paths.log_dir, cfg.get("ckpt"), cfg.get("run"))
        from gru_experiments.runs.checks import check_added_keys
        from gru_experiments.runs.sample_checks import validate_sample

        check_added_keys()  # +num_chars=0: a key nothing reads
        spec = validate_sample(cfg)  # bad values refused before the checkpoint is read; below, the spec alone
        try:
            if spec.explore:
                from gru_experiments.runs.sampling import explore_run

                explore_run(spec, checkpoint)
            else:
                from gru_experiments.runs.sampling import sample

                sample(spec, checkpoint)
        finally:  # explore=true writes in the run's folder, a stopped sample nothing: no empty folder left
            discard_untouched_run_dir(cfg.paths.log_dir)


if __name__ == "__main__":
    with job(argv=sys.argv, report=True):  # ~/ expanded, a value Hydra's lexer refuses: one line (runs/jobs.py)
        sys.argv = command_line(sys.argv)
    main()
