"""The best checkpoint's figures (runs/scoring.py): a best checkpoint missing from its run folder leaves its
figures out, with a line that names the file."""

from __future__ import annotations


def test_a_missing_best_checkpoint_leaves_its_figures_out_and_says_so(tmp_path):
    """A run folder copied (or resumed on another machine) without its best checkpoint: the run still ends with
    every other figure, the best checkpoint's left out with a line that names the file."""
    from gru_experiments.runs.scoring import format_best, score_best

    path = tmp_path / "checkpoints" / "best-epoch6-step1750.ckpt"
    best = score_best(None, {"train_steps": 3750, "best_checkpoint": str(path)}, None, None)
    assert best["missing"] and best["step"] is None and best["val_bpc"] is None and best["stateful_bpc"] is None
    assert format_best(best) == f"best checkpoint by val/loss: {path} is missing, so its figures are left out"
