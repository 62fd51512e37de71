"""runs/loggers.py: W&B's mode checked before any work, and the console of a run saying each thing once."""

from __future__ import annotations

import pytest
from robustness_helpers import TINY, run_script


@pytest.mark.slow
def test_train_py_says_each_thing_once_and_nothing_a_user_cannot_act_on(tmp_path, tiny_corpus):
    """Lightning's lines came twice (Hydra's console handler and Lightning's own), with a tip advertising another
    logger, a deprecation inside Lightning, and W&B's "anonymous setting has no effect" (issue 36)."""
    result = run_script(tmp_path, *TINY, f"data.path={tiny_corpus}", "logger=wandb", "trainer.max_steps=2",
                        "evaluation.text.samples=0", "evaluation.curve_longest=null", WANDB_SILENT="false")
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    assert console.count("device: cpu, precision: ") == 1 and console.count("| 2 steps at ") == 1
    for noise in ("Tip:", "LeafSpec", "anonymous setting", "TPU available", "Loading `train_dataloader`",
                  "FLOPs", "Total params", "GPU available: False", "`Trainer.fit` stopped"):
        assert noise not in console, noise  # the model summary (its FLOPs 0), what the run's own lines say
