"""A run folder copied or moved, then resumed: the checkpoint callbacks keep the best score and find the best and
last checkpoints in the new folder (runs/checkpoints.RunCheckpoint), where Lightning's own ModelCheckpoint keeps the
old folder's best_model_path and forgets the score."""

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from gru_experiments.runs.checkpoints import RunCheckpoint, StepCheckpoint
from gru_experiments.runs.training import checkpoint_callbacks


def saved_state(folder):
    best = str(folder / "best-epoch3-step80.ckpt")
    return {"monitor": "val/loss", "best_model_score": torch.tensor(1.25), "best_model_path": best,
            "current_score": torch.tensor(1.3), "dirpath": str(folder), "best_k_models": {best: torch.tensor(1.25)},
            "kth_best_model_path": best, "kth_value": torch.tensor(1.25), "last_model_path": str(folder / "last.ckpt")}


def test_a_moved_folder_keeps_its_best_score_and_finds_its_checkpoints_in_the_new_place(tmp_path):
    old, new = tmp_path / "run" / "checkpoints", tmp_path / "copy" / "checkpoints"
    callback = RunCheckpoint(dirpath=new, monitor="val/loss", mode="min", save_top_k=1, save_last=True)
    callback.load_state_dict(saved_state(old))
    assert callback.best_model_path == str(new / "best-epoch3-step80.ckpt")
    assert callback.kth_best_model_path == callback.best_model_path
    assert callback.last_model_path == str(new / "last.ckpt")
    assert list(callback.best_k_models) == [callback.best_model_path]
    assert float(callback.best_model_score) == 1.25  # a later, worse validation is not the best


def test_lightnings_own_callback_is_what_it_fixes(tmp_path):
    """If Lightning ever keeps the moved state itself, RunCheckpoint can go."""
    old, new = tmp_path / "run" / "checkpoints", tmp_path / "copy" / "checkpoints"
    plain = ModelCheckpoint(dirpath=new, monitor="val/loss", mode="min", save_top_k=1)
    plain.load_state_dict(saved_state(old))
    assert plain.best_model_path == str(old / "best-epoch3-step80.ckpt") and plain.best_model_score is None


def test_the_same_folder_restores_as_lightning_does(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    callback = RunCheckpoint(dirpath=folder, monitor="val/loss", mode="min", save_top_k=1)
    callback.load_state_dict(saved_state(folder))
    assert callback.best_model_path == str(folder / "best-epoch3-step80.ckpt") and float(callback.kth_value) == 1.25


def test_the_training_uses_it_for_both_checkpoints(tmp_path):
    best, periodic = checkpoint_callbacks(tmp_path, every_n_steps=50)
    assert type(best) is RunCheckpoint and isinstance(periodic, StepCheckpoint) and isinstance(periodic, RunCheckpoint)
