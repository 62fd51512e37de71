"""The run spec: one training run as its checked config asks for it (runs/checks.validate builds it), in plain
values. Below train() every step reads the spec, never the config (tests/test_spec.py)."""

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.data.recall_probe import ProbeSettings
from gru_experiments.runs.recipe import Recipe, recipe_length
from gru_experiments.study.evaluation import EvaluationSettings


@dataclass(frozen=True)
class RunSpec:
    """One training run as its checked config asks for it, built once (`validate`): nothing below train() reads the
    config itself. Its dicts are plain containers, resolved (but `config`), read and never changed."""
    # The model: its architecture (models/protocol.py), a trained family's recipe (None: a counted one) and length.
    model_name: str
    seed: int
    architecture: dict
    recipe: Recipe | None
    lr: float | None
    epochs: int
    steps_per_epoch: int
    # The data: the groups as data/corpus.py reads them, the batches (conf/training/), the recall probe (None: off).
    data: dict
    tokenizer: dict
    seq_len: int
    batch_size: int
    eval_batch_size: int
    validation_tokens: int | None  # the validations over training score the split's first this many (None: all)
    batching: str
    probe: ProbeSettings | None
    recall_weight: float
    # The evaluation group, built; evaluation_window: evaluation.window as given (None: the training window).
    evaluation: EvaluationSettings
    evaluation_window: int | None
    # The trainer group (for hydra.utils.instantiate) and what the run reads of it and beside it (smoke: fast_dev_run;
    # checkpoint_every_n_steps 0: at epoch ends only); early stopping's and the logger's settings (None: off).
    trainer: dict
    smoke: bool
    progress_bars: bool
    precision: str | int | None
    low_precision_matmuls: str
    cuda_graphs: bool
    checkpoint_every_n_steps: int
    early_stopping: dict | None
    logger: dict | None
    # Where it writes and reads: its run folder, the data folder (downloads, tokenizers).
    output_dir: Path
    data_dir: Path
    # The whole config: unresolved, as recorded (.hydra/, the checkpoints' run_config); resolved (the loggers').
    config: dict
    resolved_config: dict

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @classmethod
    def of(cls, cfg, recipe: Recipe | None, probe: ProbeSettings | None, evaluation: EvaluationSettings) -> "RunSpec":
        """The spec of a checked config, with what validation built of it."""
        resolved = OmegaConf.to_container(cfg, resolve=True)
        epochs, steps_per_epoch = recipe_length(cfg)
        trainer, stopping, logger = resolved["trainer"], resolved.get("early_stopping"), resolved.get("logger")
        return cls(
            model_name=cfg.model.name, seed=cfg.seed, architecture=resolved["model"]["architecture"], recipe=recipe,
            lr=cfg.model.get("lr"), epochs=epochs, steps_per_epoch=steps_per_epoch,
            data=resolved["data"], tokenizer=resolved.get("tokenizer"), seq_len=cfg.data.seq_len,
            batch_size=cfg.data.batch_size, eval_batch_size=cfg.data.eval_batch_size,
            validation_tokens=cfg.data.get("validation_tokens"),  # a run config from before the key: None
            batching=(resolved.get("training") or {}).get("batching") or "windows",  # configs from before training=
            probe=probe, recall_weight=OmegaConf.select(cfg, "training.recall_weight", default=1),
            evaluation=evaluation, evaluation_window=resolved["evaluation"].get("window"),
            trainer=trainer, smoke=bool(trainer.get("fast_dev_run", False)),
            progress_bars=bool(trainer.get("enable_progress_bar", True)), precision=trainer.get("precision"),
            low_precision_matmuls=cfg.get("low_precision_matmuls") or "never",
            cuda_graphs=OmegaConf.select(cfg, "cuda_graphs", default=True),
            checkpoint_every_n_steps=OmegaConf.select(cfg, "checkpoint.every_n_steps", default=0) or 0,
            early_stopping=stopping if stopping and stopping.get("patience") is not None else None,
            logger=logger if logger and "_target_" in logger else None,
            output_dir=Path(cfg.paths.output_dir), data_dir=Path(cfg.paths.data_dir),
            config=OmegaConf.to_container(cfg, resolve=False), resolved_config=resolved)
