"""One trained run, one door: the end-of-run figures (summary.json), sample.py's evaluate=true (evaluation.json)
and the Python API's `load(run).evaluate()` and `.score(text, mode)` of the same checkpoint agree to the last digit,
and every one of them runs through runs/trained_run.evaluate."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gru_experiments import api
from gru_experiments.data.corpus import split_text
from gru_experiments.files import finite_or_null
from gru_experiments.runs import trained_run
from gru_experiments.runs.sample_checks import validate_sample
from gru_experiments.study.evaluation import FIGURES

CONF = Path(__file__).resolve().parent.parent / "conf"
# what only the end-of-run evaluation adds (the text statistics: evaluate=true leaves them to stats=true)
END_OF_RUN_ONLY = {"text"}


@pytest.fixture
def door_calls(monkeypatch) -> list[str]:
    """The purpose of every evaluation run through the door (trained_run.evaluate's study.evaluation.evaluate)."""
    calls, door = [], trained_run.evaluate_plan

    def counted(request, *args, **kwargs):
        calls.append(request.purpose)
        return door(request, *args, **kwargs)

    monkeypatch.setattr(trained_run, "evaluate_plan", counted)
    return calls


def test_the_end_of_run_sample_py_and_the_api_agree_through_one_door(tmp_path, tiny_corpus, door_calls):
    from gru_experiments.runs.sampling import sample

    summary = api.train([f"data.path={tiny_corpus}", "logger=none", "data.batch_size=4", "data.seq_len=32",
                         "trainer.max_steps=3", "model.steps_per_epoch=3", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.samples.chars=10", "evaluation.text.samples=0",
                         "evaluation.curve_longest=64"], root=tmp_path)
    assert door_calls.count("final") == 1  # the end of training: its final weights, through the door
    run_dir = Path(summary["run_dir"])
    assert summary["mode_evaluation"]["budget"] is not None  # a budgeted plan: sampled figures, the same samples

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        sample_cfg = compose(config_name="sample", overrides=[
            f"run={run_dir}", "evaluate=true", "max_new_tokens=5", "device=cpu", "prompt=arbre",
            f"paths.output_dir={tmp_path / 'sampled'}", f"paths.data_dir={tmp_path / 'data'}"])
    sample(validate_sample(sample_cfg), run_dir / "checkpoints" / "last.ckpt")
    assert door_calls.count("final") == 2
    evaluation = json.loads((tmp_path / "sampled" / "evaluation.json").read_text())
    from_api = finite_or_null(api.load(run_dir).evaluate())  # as the files write it: NaN as null
    assert door_calls.count("final") == 3

    figures = {key: value for key, value in from_api.items() if key != "mode_evaluation"}
    assert {f"{figure}_bpc" for figure in FIGURES} <= set(figures) and "context_curve" in figures
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key, value in figures.items():  # to the last digit: ==, not approx
        assert evaluation[key] == value == on_disk[key], key
    assert evaluation["settings"] == from_api["mode_evaluation"] == on_disk["mode_evaluation"]
    assert not END_OF_RUN_ONLY & set(figures)

    # score(text, mode) is the same door on a text of its own: the validation split's stateless figure (a table of
    # the model's one-token predictions, exact under any budget) to the last digit.
    _, val_text = split_text(tiny_corpus.read_text(encoding="utf-8"), api.load(run_dir).run.data["train_fraction"])
    before = len(door_calls)
    scored = api.load(run_dir).score(val_text, "stateless")
    assert len(door_calls) == before + 1
    assert scored.bpc == summary["stateless_bpc"] and scored.nll == summary["stateless_nll"]


def test_sample_py_scores_by_the_runs_own_evaluation_group_unless_told_otherwise(tmp_path, tiny_corpus):
    """A run trained with evaluation.window=8 is scored with window 8 by evaluate=true and the API (not sample.py's
    default, the training window); an evaluation key given to the command changes it for that command."""
    from gru_experiments.runs.sampling import load_run

    summary = api.train([f"data.path={tiny_corpus}", "logger=none", "data.batch_size=4", "data.seq_len=32",
                         "trainer.max_steps=1", "model.steps_per_epoch=1", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.window=8", "evaluation.samples.chars=10",
                         "evaluation.text.samples=0", "evaluation.curve_longest=null"], root=tmp_path)
    run_dir = Path(summary["run_dir"])
    assert summary["mode_evaluation"]["window"] == 8
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        sample_cfg = compose(config_name="sample", overrides=[f"run={run_dir}", "device=cpu",
                                                              f"paths.output_dir={tmp_path / 'sampled'}"])
    trained = load_run(validate_sample(sample_cfg), run_dir / "checkpoints" / "last.ckpt", reads_corpus=True)
    assert trained.evaluation_settings().window == 8 and trained.seq_len == 32
    assert api.load(run_dir).run.evaluation_settings().window == 8
    assert trained.evaluation_settings({"window": 16}).window == 16
