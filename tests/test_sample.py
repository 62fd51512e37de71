"""sample.py (runs/sampling.py, its checks in runs/sample_checks.py): what it cannot use refused in one line
before any output, a run folder without its saved config, a bar per prompt, the sampling folder, explore=
beside evaluate= and stats=, a run still training and a corpus edited since."""

from __future__ import annotations

import re

import pytest
from conftest import CONF
from hydra import compose, initialize_config_dir
from robustness_helpers import REPO, TINY, error_line, run_script

from gru_experiments.runs.training import train


@pytest.fixture(scope="module")
def run_without_config(tmp_path_factory, tiny_corpus):
    """A 2-step run trained in Python, under its own PROJECT_ROOT: its checkpoint, but no .hydra/config.yaml."""
    root = tmp_path_factory.mktemp("no_config")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=[f"paths.output_dir={root / 'run'}", f"paths.data_dir={root / 'data'}",
                                          f"paths.log_dir={root / 'outputs'}", *TINY, f"data.path={tiny_corpus}",
                                          "trainer.max_steps=2", "evaluation.text.samples=0",
                                          "evaluation.curve_longest=null"]))
    return root


def sample_py(root, *overrides: str):
    return run_script(root, f"run={root / 'run'}", *overrides, script=REPO / "sample.py")


@pytest.mark.slow
def test_unknown_top_level_keys_are_refused_by_train_py_and_sample_py(run_without_config):
    root = run_without_config
    for result, key in ((run_script(root, "+colour=red", *TINY), "colour"), (sample_py(root, "+num_chars=0"),
                                                                            "num_chars")):
        assert result.returncode == 2 and error_line(result.stderr) == (
            f"error: {key} is not a key of this command's config, so nothing would read it: leave out +{key} "
            "(--cfg job lists the keys)")
    assert not list(root.glob("outputs/**/*"))  # neither a run folder nor a sampling folder left


@pytest.mark.slow
def test_a_run_without_its_config_is_explored_on_its_own_corpus_or_refused(run_without_config, tiny_corpus):
    """explore=true (and evaluate=true) read the corpus the run's saved config names; without one they scored
    Tiny Shakespeare in its place. Given data.path, the page goes to the run folder and no sampling folder stays."""
    root = run_without_config
    for extra in (["explore=true"], ["evaluate=true", "prompt=a"]):
        result = sample_py(root, *extra)
        assert result.returncode == 2 and error_line(result.stderr) == (
            f"error: the corpus the model trained on is unknown ({root / 'run' / '.hydra' / 'config.yaml'} is missing, "
            "and the checkpoint does not name it): give it with data.path=FILE (data.path=null: Tiny Shakespeare), "
            "and data.seq_len if the run's was not the default")
    result = sample_py(root, "explore=true", f"data.path={tiny_corpus}", "explore_chars=200")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (root / "run" / "explore.html").is_file() and not list(root.glob("outputs/**/*"))


@pytest.mark.slow
def test_long_generation_shows_a_bar_per_prompt(run_without_config):
    result = sample_py(run_without_config, "prompt=[a,b]", "num_samples=2", "max_new_tokens=1500")
    assert result.returncode == 0, result.stderr[-2000:]
    bars = result.stderr.replace("\r", "\n")
    for prompt in "ab":  # tokens generated: num_samples x max_new_tokens
        assert re.search(rf"sampling '{prompt}': stateful: 100%.*3.00k/3.00k", bars), bars[-2000:]
    [folder] = (run_without_config / "outputs" / "samples").glob("*/*/")
    assert {p.name for p in folder.iterdir()} == {".hydra", "samples.txt", "sampling.json"}


def test_a_long_prompt_is_cut_in_the_progress_bars_label():
    from gru_experiments.runs.sampling import shown_prompt

    assert shown_prompt("ROMEO: ") == "'ROMEO: '"
    label = shown_prompt("x" * 100_000)
    assert len(label) < 80 and label.endswith("(100,000 characters)")
