"""Every input answered (issues 36, 43): strict JSON whatever a statistic could not be, a diverging run that says
so, sizes checked before the work, keys that would do nothing refused, sample.py's corpus, bar and folder. The
resume cases are in tests/test_resume.py; docs/robustness.md has the table of inputs and answers."""

from __future__ import annotations

import json
import math
import re

import pytest
from conftest import CONF, strict_json
from hydra import compose, initialize_config_dir
from robustness_helpers import REPO, TINY, error_line, fail_in_process, run_script

from gru_experiments.errors import UserError
from gru_experiments.files import write_json
from gru_experiments.runs.checks import check_added_keys, check_choices, validate
from gru_experiments.runs.training import train


def test_json_is_strict_a_number_that_is_not_finite_is_null(tmp_path):
    path = write_json(tmp_path / "x.json", {"se": math.nan, "curve": [1.5, math.inf, (-math.inf, 2)],
                                            "nested": {"rate": math.nan}, "n": 3, "text": "NaN"})
    assert strict_json(path.read_text()) == {"se": None, "curve": [1.5, None, [None, 2]], "nested": {"rate": None},
                                             "n": 3, "text": "NaN"}


def test_a_smoke_run_writes_strict_json_and_says_why_a_figure_is_missing(compose_config, tiny_corpus, tmp_path):
    """fast_dev_run scores a small slice: stateful - windowed may share too few targets for a standard error,
    which summary.json gave as NaN; now null, with the reason beside it."""
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "trainer.fast_dev_run=true",
                                   "evaluation.text.samples=0"))
    assert math.isnan(summary["state_gain_se"])  # in memory: no pair of targets to take it from
    run = tmp_path / "run"
    written = {name: strict_json((run / name).read_text()) for name in ("summary.json", "samples.json")}
    assert written["summary.json"]["state_gain_se"] is None and written["summary.json"]["status"] == "completed"
    assert written["summary.json"]["state_gain_note"].startswith("stateful - windowed (32 tokens) not measured: "
                                                                 "paired on 0 target(s)")


def test_a_diverging_run_stops_with_one_line_and_says_so_in_summary_json(compose_config, tiny_corpus, tmp_path,
                                                                         capsys):
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "model.lr=1e6", "trainer.max_steps=30",
                         "checkpoint.every_n_steps=1")
    line = fail_in_process(capsys, cfg)
    assert line.startswith("error: training diverged: the loss is ")
    assert "above 4 x ln 54 = 16.0 nats" in line and line.endswith("try a lower model.lr")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("TrainingDiverged: training diverged")


@pytest.mark.parametrize("overrides, message", [
    (["+probe.keys=8"], "probe.keys is a setting of probe=recall, but the probe is off (probe=none); add "
                        "probe=recall to plant the pairs, or leave out probe.keys"),
    (["probe=recall", "probe.name=bogus"], "invalid probe.name='bogus': must be none or recall"),
    (["probe.name=recall"], "probe.name=recall names the probe but sets none of its keys: the probe is chosen "
                            "with its config group, probe=recall"),
    (["probe=recall", "+probe.colour=red"], "unknown key probe.colour"),
])
def test_probe_keys_that_would_do_nothing_are_refused(compose_config, overrides, message):
    with pytest.raises(UserError) as error:
        validate(compose_config(*overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_probe_groups_pass_and_are_read(compose_config):
    assert validate(compose_config("probe=none")).probe is None
    for probe in ("recall", "recall_sparse"):
        cfg = compose_config(f"probe={probe}")
        assert validate(cfg).probe.keys == cfg.probe["keys"] > 0  # the spec carries the chosen probe's settings


@pytest.mark.parametrize("overrides, message", [
    ("evaluation.window=5000", "evaluation.window=5,000 is not shorter than the validation split (1,999 targets): "
                               "no target has that much context before it"),
    ("data.batch_size=1000", "data.batch_size=1000 x data.seq_len=32 is 32,000 tokens a batch, more than the "
                             "training split's 18,000: set data.batch_size to at most 562"),
    ("probe=recall probe.phases=[{start:0,distances:[2000000],gap:2}]",
     "invalid probe.phases[0].distances: 2,000,000 does not fit the training split (18,000 tokens; a pair takes "
     "2 x probe.phases[0].gap + its distance of them), so it would never be planted; use distances up to 17,996"),
])
def test_a_size_larger_than_its_split_is_refused_before_any_work(compose_config, tiny_corpus, tmp_path, capsys,
                                                                 overrides, message):
    line = fail_in_process(capsys, compose_config(*TINY, f"data.path={tiny_corpus}", *overrides.split()))
    assert line.startswith(f"error: {message}")
    assert not (tmp_path / "run").exists()


def test_a_warmup_longer_than_the_run_and_an_exact_evaluation_say_so_up_front(compose_config, tiny_corpus, capsys):
    train(compose_config(*TINY, f"data.path={tiny_corpus}", "trainer.max_steps=2", "optim.warmup_steps=50",
                         "evaluation.budget=null", "evaluation.text.samples=0", "evaluation.curve_longest=null"))
    out = capsys.readouterr().out
    assert ("optim.warmup_steps=50 is not shorter than this run's 2 steps: the learning rate never leaves its warmup "
            "(it ends at 3.9% of model.lr)") in out
    exact = next(line for line in out.splitlines() if line.startswith("evaluation: ") and "exact" in line)
    assert out.index(exact) < out.index("evaluation of the final weights")  # before the work, not after
    assert re.fullmatch(r"evaluation: [\d,]+ forward tokens \(.+; [\d,.]+ per token trained\), every figure exact "
                        r"\(evaluation.budget=null\)", exact)


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


@pytest.mark.slow
def test_one_model_a_run_a_list_or_a_model_beside_an_experiment_is_refused(tmp_path):
    """model=[a,b] and experiment=[a,b] merged two configs into one run (the last winning), and experiment=X
    model=Y trained Y in X's place: each refused in one line naming the key."""
    check_choices(["model=astra_beta", "experiment=null", "data.seq_len=64"])
    check_choices(["experiment=recall_alpha_windows", "probe=recall"])
    for group in ("model", "experiment"):
        with pytest.raises(UserError, match=re.escape(f"{group}=[a,b]: one {group} a run (a list merges them into "
                                                      f"one config, the last winning); each its own run: python "
                                                      f"sweep.py {group}s=[a,b]")):
            check_choices([f"{group}=[a,b]"])
    result = run_script(tmp_path, "experiment=recall_alpha_windows", "model=astra_beta", *TINY)
    assert result.returncode == 2 and error_line(result.stderr) == (
        "error: model=astra_beta: experiment=recall_alpha_windows picks its own model (conf/experiment/); give one of "
        "the two")
    result = run_script(tmp_path, "model=[astra_alpha_original,transformer_original]", *TINY)
    assert result.returncode == 2 and "model=[astra_alpha_original,transformer_original]: one model a run" in \
        error_line(result.stderr)
    assert not list(tmp_path.glob("outputs/**/*"))  # no run folder left


def test_the_epochs_have_one_knob_model_epochs(compose_config):
    """The trainer takes its epochs from the model's recipe (runs/recipe.recipe_length): trainer.max_epochs is no
    key of conf/trainer, and one added with + would be a second knob: refused in one line naming it."""
    with pytest.raises(UserError, match=re.escape("trainer.max_epochs: a run's epochs are its model's, model.epochs")):
        validate(compose_config("+trainer.max_epochs=3"))


@pytest.mark.slow
def test_a_key_added_to_a_group_whose_option_does_not_read_it_is_refused(tmp_path):
    check_added_keys(["+trainer.limit_val_batches=0.5", "+model.architecture.extra=1", "data.seq_len=64",
                      "++evaluation.window=64", "++colour=red", "+hydra/launcher=parallel"],
                     groups={"hydra/launcher": "parallel"})  # handed on to Lightning or the model; an override; a group
    with pytest.raises(UserError, match=re.escape("colour is not a key of this command's config, so nothing would "
                                                  "read it: leave out +colour (--cfg job lists the keys)")):
        check_added_keys(["+colour=red"], groups={"model": "astra_alpha"})
    for key in ("+tokenizer.vocab_size", "+evaluation.colour", "+data.shuffle", "+optim.momentum"):
        group = key[1:].split(".")[0]
        with pytest.raises(UserError, match=re.escape(f"{key[1:]} is not a key of the chosen {group} option, so "
                                                      f"nothing would read it: leave out {key}")):
            check_added_keys([f"{key}=1"])
    result = run_script(tmp_path, "tokenizer=char", "+tokenizer.vocab_size=100", *TINY)  # as train.py gets it
    assert result.returncode == 2 and "tokenizer.vocab_size is not a key of the chosen tokenizer option" in \
        error_line(result.stderr)
    assert not list(tmp_path.glob("outputs/**/*"))  # no run folder left


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
