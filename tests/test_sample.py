"""sample.py (runs/sampling.py, its checks in runs/sample_checks.py): what it cannot use refused in one line
before any output, a run folder without its saved config, a bar per prompt, the sampling folder, explore=
beside evaluate= and stats=, a run still training and a corpus edited since."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import CONF
from hydra import compose, initialize_config_dir
from robustness_helpers import NO_GPU, REPO, TINY, assert_untouched, error_line, fingerprint, run_script, train

from gru_experiments.errors import UserError
from gru_experiments.runs import sampling
from gru_experiments.runs.run_dir import find_checkpoint
from gru_experiments.runs.sample_checks import validate_sample


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


def outputs_of(root: Path) -> set[Path]:
    """Every file and folder under the workspace's outputs/: what a refused command must leave as it was."""
    return set(root.glob("outputs/**/*"))


@pytest.mark.slow
def test_unknown_top_level_keys_are_refused_by_train_py_and_sample_py(run_without_config):
    root = run_without_config
    before = outputs_of(root)  # another test of the module's may have sampled into it already
    for result, key in ((run_script(root, "+colour=red", *TINY), "colour"), (sample_py(root, "+num_chars=0"),
                                                                            "num_chars")):
        assert result.returncode == 2 and error_line(result.stderr) == (
            f"error: {key} is not a key of this command's config, so nothing would read it: leave out +{key} "
            "(--cfg job lists the keys)")
    assert outputs_of(root) == before  # neither a run folder nor a sampling folder left


@pytest.mark.slow
def test_a_run_without_its_config_is_explored_on_its_own_corpus_or_refused(run_without_config, tiny_corpus):
    """explore=true (and evaluate=true) read the corpus the run's saved config names; without one they scored
    Tiny Shakespeare in its place. Given data.path, the page goes to the run folder and no sampling folder stays."""
    root = run_without_config
    before = outputs_of(root)
    for extra in (["explore=true"], ["evaluate=true", "prompt=a"]):
        result = sample_py(root, *extra)
        assert result.returncode == 2 and error_line(result.stderr) == (
            f"error: the corpus the model trained on is unknown ({root / 'run' / '.hydra' / 'config.yaml'} is missing, "
            "and the checkpoint does not name it): give it with data.path=FILE (data.path=null: Tiny Shakespeare), "
            "and data.seq_len if the run's was not the default")
    result = sample_py(root, "explore=true", f"data.path={tiny_corpus}", "explore_chars=200")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (root / "run" / "explore.html").is_file() and outputs_of(root) == before


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


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_corpus):
    """A two-step Astra-α run, and a copy of it in a second run folder."""
    from robustness_helpers import train

    root = tmp_path_factory.mktemp("answered")
    run = root / "outputs" / "runs" / "astra_alpha" / "run1"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            f"paths.output_dir={run}", f"paths.data_dir={root / 'data'}", f"paths.log_dir={root / 'outputs'}",
            f"data.path={tiny_corpus}", *TINY, "trainer.max_steps=2", "model.steps_per_epoch=2",
            "evaluation.budget=0.01", "evaluation.samples.chars=20"])
    train(cfg)
    shutil.copytree(run, run.with_name("run2"))
    return root, run, run.with_name("run2")


def sample_config(root: Path, tiny_corpus, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="sample", overrides=[
            f"paths.log_dir={root / 'outputs'}", f"paths.data_dir={root / 'data'}",
            f"paths.output_dir={root / 'samples'}", f"data.path={tiny_corpus}", "data.seq_len=32", "device=cpu",
            "prompt=JUAN", "max_new_tokens=5", *overrides])


@pytest.fixture
def latin1(tmp_path) -> Path:
    path = tmp_path / "latin1.txt"
    path.write_bytes("JUAN: caf\xe9\n".encode("latin-1"))
    return path


@pytest.mark.parametrize("overrides, message", [
    (["device=banana"], "device=banana: not a device: give auto (a GPU where there is one), cpu, cuda, cuda:N or mps"),
    pytest.param(["device=cuda"], f"device=cuda: {NO_GPU}", marks=pytest.mark.skipif(NO_GPU is None, reason="a GPU")),
    (["cpu_threads=-3"], "invalid cpu_threads=-3: must be null (torch's default) or an integer >= 1"),
    (["cpu_threads=abc"], "invalid cpu_threads='abc': must be null (torch's default) or an integer >= 1"),
    (["prompt=[]"], "prompt=[] gives no prompt to sample from"),
    (["~prompt", "prompt_file={latin1}"], "prompt_file={latin1} is not UTF-8 text: byte 0xe9 at offset 9, line 1; "
                                         "convert it first, e.g. iconv -f latin1 -t utf-8"),
    (["explore=true", "explore_file={latin1}"], "explore_file={latin1} is not UTF-8 text: byte 0xe9 at offset 9"),
    (["ckpt={run2}/checkpoints/last.ckpt"], "ckpt={run2}/checkpoints/last.ckpt is a checkpoint of the run {run2}, "
                                            "but run={run1} names another run: give one of them"),
    (["evaluate=true", "evaluation.streams=100000"], "evaluation.streams=100,000 is not below the validation split's "
                                                     "1,999 targets"),
    # issue 72: sample.py took windows train.py refuses (its bar then read "600M tokens"); a folder as the prompts
    (["evaluate=true", "evaluation.window=1999"], "evaluation.window=1,999 is not shorter than the validation split "
                                                  "(1,999 targets): no target has that much context before it"),
    (["explore=true", "evaluation.window=100000"], "evaluation.window=100,000 is not shorter than the validation"),
    (["~prompt", "prompt_file={run2}"], "prompt_file={run2} is a directory: give a UTF-8 text file"),
])
def test_sample_py_settings_it_cannot_use_get_one_line_before_any_output(two_runs, tiny_corpus, latin1, overrides,
                                                                        message):
    root, run1, run2 = two_runs
    names = {"latin1": latin1, "run1": run1, "run2": run2}
    cfg = sample_config(root, tiny_corpus, f"run={run1}", *(o.format(**names) for o in overrides))
    checkpoint = find_checkpoint(cfg.model.name, cfg.paths.log_dir, cfg.ckpt, cfg.run)  # as sample.py finds it
    before = fingerprint(root)
    with pytest.raises(UserError) as refused:
        spec = validate_sample(cfg)  # as sample.py: the settings, then the checkpoint
        (sampling.explore_run if spec.explore else sampling.sample)(spec, checkpoint)
    assert str(refused.value).startswith(message.format(**names))
    assert_untouched(before, fingerprint(root))


def test_explore_with_evaluate_and_stats_does_all_three(two_runs, tiny_corpus):
    root, run1, _ = two_runs
    cfg = sample_config(root, tiny_corpus, f"run={run1}", "explore=true", "evaluate=true", "stats=true",
                        "explore_chars=300", "evaluation.budget=0.01", "evaluation.text.samples=1",
                        "evaluation.text.chars=32", "evaluation.text.drift_chars=0")
    record = sampling.explore_run(validate_sample(cfg), run1 / "checkpoints" / "last.ckpt")
    assert record["explore"] == run1 / "explore.html" and record["explore"].is_file()
    assert record["evaluation"]["stateful_bpc"] > 0 and record["text"]["settings"]
    assert {path.name for path in (root / "samples").iterdir()} == {"evaluation.json", "stats.json"}


def test_evaluate_and_explore_refuse_a_corpus_edited_since_the_run_trained_on_it(two_runs, tiny_corpus, tmp_path):
    """Issue 72: sample.py evaluate=true scored an edited corpus with no word, where a resume refuses it."""
    root, run1, _ = two_runs
    edited = tmp_path / "edited.txt"  # the run's corpus, edited since (its text given again as data.path)
    edited.write_text(tiny_corpus.read_text(encoding="utf-8").replace("a", "e"), encoding="utf-8")
    for asked in (["evaluate=true"], ["explore=true"]):
        spec = validate_sample(sample_config(root, edited, f"run={run1}", *asked))
        with pytest.raises(UserError, match=rf"^the corpus changed since astra_alpha trained on it: {edited} has "
                                            r"sha256 \w+, but checkpoint .* was trained on sha256 \w+; its figures "
                                            "would score another text: restore that text$"):
            (sampling.explore_run if spec.explore else sampling.sample)(spec, run1 / "checkpoints" / "last.ckpt")


def test_explore_on_a_run_still_training_is_refused_naming_the_lock(two_runs, tiny_corpus):
    """Issue 72: explore=true wrote explore.html into a training run's locked folder, from a mid-training checkpoint,
    naming no step (a page now names its checkpoint's step)."""
    from gru_experiments.errors import RunFolderTaken
    from gru_experiments.runs.run_dir import RunDir

    root, _, run2 = two_runs
    spec = validate_sample(sample_config(root, tiny_corpus, f"run={run2}", "explore=true", "explore_chars=100"))
    before = fingerprint(run2)
    with RunDir(run2).hold(), pytest.raises(RunFolderTaken, match=rf"^{run2} is in use: another process is training "
                                                                  "in it .* so this command cannot write its "
                                                                  "explore.html from a checkpoint of a run still"):
        sampling.explore_run(spec, run2 / "checkpoints" / "last.ckpt")
    assert_untouched(before, fingerprint(run2))
    page = sampling.explore_run(spec, run2 / "checkpoints" / "last.ckpt")["explore"].read_text(encoding="utf-8")
    assert "last.ckpt (step 2)" in page


def test_model_beside_run_is_named_as_ignored(two_runs, tiny_corpus, monkeypatch, capsys):
    """Issue 72: sample.py run=R model=lstm sampled R's model with no word of model=."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    root, run1, _ = two_runs
    cfg = sample_config(root, tiny_corpus, f"run={run1}", "model=lstm")
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(overrides=SimpleNamespace(
        task=[f"run={run1}", "model=lstm"]))))
    validate_sample(cfg)
    assert capsys.readouterr().out.startswith("model=lstm is ignored: run= names the checkpoint, whose own model is "
                                              "sampled")
