"""Checkpoint files: read without running code, written atomically, never with broken weights (docs/internals.md)."""

import pickle
import random
import re
import zipfile
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.loop import _Loop

from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.files import atomic_file
from gru_experiments.runs.loggers import is_wandb
from gru_experiments.runs.run_dir import RunDir, refuse_older_layout


class NonFiniteWeights(TrainingDiverged):
    """Raised instead of saving a checkpoint whose weights are nan or inf."""

# What every checkpoint the project writes contains; resuming needs the training state too.
MODEL_KEYS = ("state_dict", "hyper_parameters", "tokenizer")
TRAINING_KEYS = MODEL_KEYS + ("optimizer_states", "lr_schedulers", "loops", "pytorch-lightning_version")


def read_checkpoint(path, map_location="cpu", require: tuple[str, ...] = MODEL_KEYS, mmap: bool = False) -> dict:
    """torch.load(path, weights_only=True), every failure a UserError; mmap=True: a cheap read of its step."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise UserError(f"checkpoint path is not a file: {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        if refused := _refused_object(str(err)):
            # Nothing in the file has run: the restricted unpickler stops before calling anything.
            raise UserError(
                f"refusing to load {path}: it contains {refused}, which could run code when unpickled; "
                "only tensors and plain data are loaded (weights_only), so this file cannot be used") from None
        reason = str(err).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
        raise UserError(f"{path} is not a readable checkpoint (truncated or not a checkpoint file): {reason}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as err:
        # The first sentence: torch's own messages go on for a paragraph.
        reason = str(err).splitlines()[0].split(". ")[0] if str(err) else type(err).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or not a checkpoint file): {reason}") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{path} is not a gru-experiments checkpoint (it holds a {type(checkpoint).__name__})")
    if missing := [key for key in require if key not in checkpoint]:
        raise UserError(f"{path} is not a gru-experiments {'training ' if 'loops' in require else ''}checkpoint "
                        f"(it lacks {', '.join(missing)})")
    run = RunDir.of_checkpoint(path)  # an older layout's checkpoint: its run folder is what the script upgrades
    for record in (checkpoint.get("hyper_parameters"), checkpoint.get("run_config")):
        refuse_older_layout(record, path, "checkpoint", run.path if run else path)
    return checkpoint


def _refused_object(message: str) -> str | None:
    """The object that could run code which made the weights-only unpickler refuse a file; None otherwise."""
    if match := re.search(r"GLOBAL (\S+)", message):
        return f"a reference to the Python object {match[1]}"
    if "Can only create new object" in message or "Can only build" in message or "reduce" in message:
        return "Python objects other than tensors and plain data"
    return None


def tokenizer_summary(state: dict) -> str:
    kind = state.get("kind")
    if kind == "char":
        return f"a char tokenizer ({len(state['chars'])} characters)"
    if kind == "spm":
        from gru_experiments.data.tokenizers import tokenizer_from_state

        return f"an spm tokenizer ({tokenizer_from_state(state).vocab_size} pieces)"
    if kind == "byte":
        return "a byte tokenizer (256 bytes)"
    return f"an unknown tokenizer ({kind!r})"


def check_tokenizer(state: dict, vocab_size: int, path, tokenizer) -> None:
    """A UserError unless the checkpoint's tokenizer (its `state`, its model's `vocab_size`) is `tokenizer`."""
    if tokenizer.kind != state.get("kind") or tokenizer.vocab_size != vocab_size:
        raise UserError(f"checkpoint {path} was trained with {tokenizer_summary(state)}, but this config builds "
                        f"{tokenizer_summary(tokenizer.state_dict())}; resume with the run's own tokenizer "
                        "and data settings")
    if _vocabulary(tokenizer.state_dict()) != _vocabulary(state):
        raise UserError(f"checkpoint {path} was trained with a different {tokenizer.kind} vocabulary of the same "
                        "size (another corpus or tokenizer settings?); resume with the run's own data.path "
                        "and tokenizer settings")


def _vocabulary(state: dict) -> dict:
    """A tokenizer's state, comparable (tensors as lists), without `extra`, which older checkpoints lack."""
    return {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in state.items()
            if key != "extra"}


def weight_shapes(state_dict) -> dict[str, tuple[int, ...]]:
    """{name: shape} of a state_dict's tensors (read memory-mapped, their data stays on disk); {} for no mapping."""
    if not isinstance(state_dict, dict):
        return {}
    return {name: tuple(t.shape) for name, t in state_dict.items() if isinstance(t, torch.Tensor)}


def weights_mismatch(saved: dict, expected: dict) -> str | None:
    """What a checkpoint's weights (`weight_shapes`) lack, add or shape otherwise than the model's; None: they fit."""
    missing = [name for name in expected if name not in saved]
    extra = [name for name in saved if name not in expected]
    shaped = [f"{name} {list(saved[name])} (the model's: {list(shape)})" for name, shape in expected.items()
              if name in saved and saved[name] != shape]
    parts = [f"{what} {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" for what, names in (
        ("it lacks the weights", missing), ("it holds weights the model does not have:", extra),
        ("it holds", shaped)) if names]
    return "; ".join(parts) or None


def atomic_torch_save(obj, path) -> None:
    with atomic_file(path) as f:
        torch.save(obj, f)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: atomic writes, finite weights only, weights-only reads."""

    def __init__(self):
        super().__init__()
        self.kept: str | None = None  # the newest good checkpoint, as a divergence's message names it

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        bad = [name for name, t in checkpoint.get("state_dict", {}).items()
               if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:
            raise NonFiniteWeights(
                f"training diverged: weights became non-finite ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}) at step {checkpoint.get('global_step')}; not saved, "
                f"{self.kept or 'no checkpoint was saved before'}; try a lower model.lr")
        atomic_torch_save(checkpoint, path)
        self.kept = f"the last good checkpoint is kept: {path} (step {int(checkpoint.get('global_step', -1))})"

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        # weights_only is forced: Lightning's resume path never unpickles code either.
        return read_checkpoint(path, map_location=map_location or "cpu", require=TRAINING_KEYS)


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose state follows its run folder: resumed in a moved folder, it keeps the best score and
    finds the best and last checkpoints in the new place (Lightning's would count the next validation the best)."""

    def load_state_dict(self, state_dict: dict) -> None:
        old, new = Path(state_dict.get("dirpath") or self.dirpath), Path(self.dirpath)
        if old != new:
            def moved(path):
                return str(new / Path(path).name) if path and Path(path).parent == old else path

            paths = ("best_model_path", "kth_best_model_path", "last_model_path")
            state_dict = state_dict | {key: moved(state_dict.get(key)) for key in paths} | {
                "dirpath": str(new),
                "best_k_models": {moved(path): score for path, score in state_dict.get("best_k_models", {}).items()}}
        super().load_state_dict(state_dict)


class StepCheckpoint(RunCheckpoint):
    """ModelCheckpoint(every_n_train_steps=N) but at an epoch's last batch, whose checkpoint would not resume as
    the run goes on (the epoch-end one, moments later, takes its place): docs/internals.md, *Checkpoints*."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == trainer.num_training_batches:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class EpochEndResumes(_FitLoop):
    """Lightning's fit loop, but a checkpoint written at an epoch's end resumes as a finished epoch under
    trainer.max_steps too (Lightning 2.5, 2.6 would count the epoch twice: docs/internals.md, *Checkpoints*)."""

    @_Loop.restarting.setter
    def restarting(self, restarting: bool) -> None:
        # Lightning's own rule without max_steps: an epoch that ran to its end is not restarted.
        progress = self.epoch_progress.current
        _Loop.restarting.fset(self, restarting and not progress.ready == progress.started == progress.processed)


def resume_epoch_ends_exactly(trainer):
    """`trainer`, its fit loop an `EpochEndResumes` (its epoch loop and limits the same)."""
    loop = trainer.fit_loop
    exact = EpochEndResumes(trainer, min_epochs=loop.min_epochs, max_epochs=loop.max_epochs)
    exact.epoch_loop = loop.epoch_loop
    trainer.fit_loop = exact
    return trainer


class TrainingState(Callback):
    """The global random states (dropout's) and the W&B run id in each checkpoint: a resume continues the stream."""

    def __init__(self):
        self._trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict:
        state = {"torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        logger = self._trainer.logger if self._trainer is not None else None
        if is_wandb(logger):
            state["wandb_run_id"] = logger.version
        return state

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])  # weights_only loading keeps its tuples
        cuda = state.get("cuda_rng")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def wandb_run_id(checkpoint: dict) -> str | None:
    return checkpoint.get("callbacks", {}).get(TrainingState.__qualname__, {}).get("wandb_run_id")
