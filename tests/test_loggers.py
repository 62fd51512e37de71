"""runs/loggers.py: W&B's mode checked before any work, and the console of a run saying each thing once."""

from __future__ import annotations

import pytest
from robustness_helpers import TINY, assert_untouched, compose_in, error_line, fingerprint, run_script

from gru_experiments.errors import UserError
from gru_experiments.runs.checks import validate
from gru_experiments.runs.loggers import WANDB_MODES, wandb_mode


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


@pytest.mark.parametrize("value, shown", [("", "'' (an empty string)"), ("onlin", "'onlin'"), ("OFFLINE", "'OFFLINE'")])
def test_wandb_mode_wandb_would_refuse_is_a_user_error(monkeypatch, value, shown):
    monkeypatch.setenv("WANDB_MODE", value)
    with pytest.raises(UserError) as info:
        wandb_mode()
    assert str(info.value).startswith(f"invalid WANDB_MODE={shown} (environment variable): must be online, offline "
                                      "or disabled")


def test_wandb_modes_wandb_accepts_pass(monkeypatch):
    for value in WANDB_MODES:
        monkeypatch.setenv("WANDB_MODE", value)
        assert wandb_mode() == value
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    assert wandb_mode() == "offline"  # unset: the project's choice
    # The same set as the installed wandb's own settings.
    from typing import get_args

    from wandb.sdk.wandb_settings import Settings

    assert set(WANDB_MODES) == set(get_args(Settings.model_fields["mode"].annotation))


@pytest.mark.parametrize("value", ["", "bogus"])
@pytest.mark.slow
def test_train_py_with_a_bad_wandb_mode_fails_before_the_run_folder(workspace, tiny_corpus, monkeypatch, value):
    """The default logger=wandb: the error comes from validate(cfg), before any work, and no run
    folder is left behind (wandb itself would fail with a pydantic traceback after it was made)."""
    before = fingerprint(workspace)
    result = run_script(workspace, f"data.path={tiny_corpus}", "data.batch_size=8", "data.seq_len=32",
                        "trainer.accelerator=cpu", WANDB_MODE=value)
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_line(result.stderr).startswith(f"error: invalid WANDB_MODE={value!r}")
    assert_untouched(before, fingerprint(workspace))
    # logger=csv does not use W&B, so the variable does not matter to it.
    monkeypatch.setenv("WANDB_MODE", value)
    validate(compose_in(workspace, f"data.path={tiny_corpus}", "logger=csv"))
    with pytest.raises(UserError, match="invalid WANDB_MODE"):
        validate(compose_in(workspace, f"data.path={tiny_corpus}", "logger=wandb"))
