"""A run's config checked before any work (runs/checks.py: validate and its checks), each refusal one line naming
the key: invalid values, NaN and infinities, sizes larger than their split, probe keys and added keys that nothing
would read, one model a run, the epochs' one knob, precisions, a window past a model's block, max_steps beyond the
recipe. The command-line rules run here without a subprocess; train.py's own runs of them are slow-marked."""

import importlib.util
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from robustness_helpers import TINY, assert_untouched, compose_in, error_line, fail_in_process, fingerprint, run_script

from gru_experiments.errors import UserError
from gru_experiments.runs.checks import check_added_keys, check_choices, check_precision, validate

GROUPS = {"model": "astra_alpha", "probe": "none", "data": "default"}


@pytest.mark.parametrize("override, message", [
    ("+num_chars=0", "num_chars is not a key of this command's config, so nothing would read it: leave out "
                     "+num_chars (--cfg job lists the keys)"),
    ("+data.bogus=1", "data.bogus is not a key of the chosen data option, so nothing would read it: leave out "
                      "+data.bogus, or choose the data option that has it (conf/data/)"),
])
def test_an_added_key_nothing_reads_is_refused_in_one_line(override, message):
    with pytest.raises(UserError) as refused:
        check_added_keys([override], GROUPS)
    assert str(refused.value) == message


@pytest.mark.parametrize("overrides, key, value", [
    (["model=lstm", "model.architecture.forget_bias=1.0"], "model.architecture.forget_bias", 1.0),  # no +
    (["++data.extra=1"], "data.extra", 1),  # ++: deliberate
    (["seed=3"], "seed", 3),  # a plain value
])
def test_what_something_reads_passes_and_arrives(compose_config, overrides, key, value):
    check_added_keys(overrides, GROUPS)
    assert OmegaConf.select(compose_config(*overrides), key) == value


def test_one_model_a_run():
    with pytest.raises(UserError, match=r"^model=\[lstm,rnn\]: one model a run .* python sweep.py models=\[lstm,rnn\]"):
        check_choices(["model=[lstm,rnn]"])
    with pytest.raises(UserError, match=r"^model=lstm: experiment=recall_alpha_windows picks its own model"):
        check_choices(["model=lstm", "experiment=recall_alpha_windows"])
    check_choices(["model=lstm", "experiment=null", "seed=2"])


@pytest.mark.parametrize("overrides, message", [
    (["trainer.max_steps=4000"], "trainer.max_steps=4000 is beyond this model's recipe, model.epochs x "
     "model.steps_per_epoch = 10 x 200 = 2,000 steps, where training ends whatever max_steps says; to train longer "
     "raise model.epochs (model.epochs=20 trains 4,000 steps, the schedule stretched over them), or give "
     "trainer.max_steps <= 2,000"),
    (["model.steps_per_epoch=10", "model.epochs=1", "trainer.max_steps=30"], "trainer.max_steps=30 is beyond this "
     "model's recipe, model.epochs x model.steps_per_epoch = 1 x 10 = 10 steps"),
])
def test_max_steps_beyond_the_recipe_is_refused_in_one_line(compose_config, overrides, message):
    """Issue 72: trainer.max_steps=4000 trained the recipe's 2,000 steps while the estimate said 3,989 (a resume's
    config goes through the same validate)."""
    from gru_experiments.runs.checks import validate

    with pytest.raises(UserError) as refused:
        validate(compose_config(*overrides))
    assert str(refused.value).startswith(message)
    validate(compose_config("trainer.max_steps=2000"))  # the recipe's own length, and below: accepted


@pytest.mark.parametrize("override, key", [("model.architecture.forget_bias=nan", "model.architecture.forget_bias"),
                                           ("model.lr=inf", "model.lr"), ("data.train_fraction=-inf",
                                                                          "data.train_fraction")])
def test_nan_and_infinity_are_refused_up_front(compose_config, override, key):
    """Issue 72: forget_bias=nan trained, then reported "training diverged ... try a lower model.lr"."""
    from gru_experiments.runs.checks import validate

    with pytest.raises(UserError, match=rf"^invalid {key}=-?(nan|inf): must be a finite number"):
        validate(compose_config("model=lstm", override))


def test_checkpoints_every_null_steps_is_refused(compose_config):
    """Issue 72: checkpoint.every_n_steps=null was taken as 0 (epoch ends only), undocumented."""
    from gru_experiments.runs.checks import validate

    with pytest.raises(UserError, match=r"^invalid checkpoint.every_n_steps=None: must be an integer >= 0 \(0: only at "
                                        r"epoch ends\)$"):
        validate(compose_config("checkpoint.every_n_steps=null"))


def test_a_trainer_key_lightning_refuses_is_one_line_on_a_new_run_and_leaves_no_folder(tmp_path):
    """+trainer.limit_val_batches=0.5 on a corpus whose validation split fills one batch: Lightning refuses it, once the
    run folder was written (a traceback and an empty folder); now one line before anything is written."""
    from conftest import make_text

    import gru_experiments

    corpus = tmp_path / "short.txt"
    corpus.write_text(make_text(4000, seed=3), encoding="utf-8")
    with pytest.raises(UserError) as refused:
        gru_experiments.train(["logger=none", "data.batch_size=4", "data.seq_len=16", f"data.path={corpus}",
                               "+trainer.limit_val_batches=0.5"], root=tmp_path)
    assert str(refused.value) == (
        "Lightning refuses the trainer settings: You requested to check 0.5 of the `val_dataloader` but 0.5 * 1 < 1. "
        "Please increase the `limit_val_batches` argument. Try at least `limit_val_batches=1.0` (this run has 200 "
        "training and 1 validation batches an epoch); nothing was written")
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.yaml"))


def test_keys_that_mean_nothing_to_a_counted_model_get_one_line(compose_config, capsys):
    """model=ngram2 with trainer.max_steps=5 or early_stopping.patience=2: accepted (a sweep gives them to every model)
    but said, where they were ignored without a line."""
    from gru_experiments.runs.checks import validate

    validate(compose_config("model=ngram2", "trainer.max_steps=5", "early_stopping.patience=2",
                            "early_stopping.min_delta=0.1"))
    assert capsys.readouterr().out == (
        "trainer.max_steps=5, early_stopping.patience=2, early_stopping.min_delta=0.1 have no effect on ngram2 "
        "(NGramLM, ngram): it is counted from the training split once and validated once, with no steps to limit or "
        "stop early\n")
    validate(compose_config("model=ngram2"))
    validate(compose_config("trainer.max_steps=5", "early_stopping.patience=2"))  # a trained model: they mean something
    assert capsys.readouterr().out == ""


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


def test_a_recall_weight_without_the_probe_says_it_has_no_effect(compose_config, capsys):
    validate(compose_config("training.recall_weight=5"))
    assert "training.recall_weight=5 has no effect without probe=recall" in capsys.readouterr().out
    validate(compose_config("training.recall_weight=5", "probe=recall"))
    validate(compose_config())
    assert "has no effect" not in capsys.readouterr().out


def test_float16_weights_for_adamw_are_refused_with_the_reason(compose_config):
    """16-true on a CPU "diverged ... try a lower model.lr", even at 1e-6: AdamW's eps is 0 in float16."""
    with pytest.raises(UserError, match=r"^trainer.precision=16-true keeps the weights and AdamW's state in float16, "
                                        r"where AdamW's eps \(1e-8\) is 0"):
        check_precision(compose_config("trainer.precision=16-true", "model.lr=1e-6"), trained=True)
    check_precision(compose_config("model=ngram2", "trainer.precision=16-true"), trained=False)  # counted: no AdamW
    check_precision(compose_config("trainer.precision=16-mixed"), trained=True)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine installed")
@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_transformer_engine_precision_without_its_package_is_refused(compose_config, precision):
    with pytest.raises(UserError, match=f"^trainer.precision={precision} needs NVIDIA's Transformer Engine, and the "
                                        "transformer_engine package is not installed"):
        check_precision(compose_config(f"trainer.precision={precision}"), trained=True)


def test_more_streams_than_validation_targets_are_refused_in_training(compose_config):
    from gru_experiments.models.protocol import meta_model
    from gru_experiments.runs.checks import check_sizes, validate

    spec = validate(compose_config(*TINY, "evaluation.streams=2000"))
    model = meta_model(spec.architecture)
    with pytest.raises(UserError, match=r"^evaluation.streams=2,000 is not below the validation split's 1,999 targets: "
                                        "each stream would hold one target"):
        check_sizes(spec, model, 18_000, 2_000)
    check_sizes(validate(compose_config(*TINY, "evaluation.streams=1998")), model, 18_000, 2_000)


BAD_VALUES = {
    "model.lr=-1": "invalid model.lr=-1: must be a number > 0",
    "model.lr=0": "invalid model.lr=0: must be a number > 0",
    "model.lr=fast": "invalid model.lr='fast': must be a number > 0",
    "data.seq_len=1": "invalid data.seq_len=1: must be an integer >= 2",
    "data.batch_size=0": "invalid data.batch_size=0: must be an integer >= 1",
    "model.architecture.dropout=-0.1": "invalid model.architecture.dropout=-0.1: must be a number in [0, 1)",
    "model.architecture.dropout=1.0": "invalid model.architecture.dropout=1.0: must be a number in [0, 1)",
    "trainer.precision=fp8": "invalid trainer.precision='fp8': must be one of",
    "trainer.precision=17": "invalid trainer.precision=17: must be one of",
    "checkpoint.every_n_steps=-5": "invalid checkpoint.every_n_steps=-5",
    "evaluation.window=0": "invalid evaluation.window=0: must be null (the training data.seq_len) or an integer >= 1",
    "evaluation.streams=0": "invalid evaluation.streams=0: must be an integer >= 1",
    "evaluation.budget=0": "invalid evaluation.budget=0: must be null (every figure exact) or a number > 0",
    "evaluation.budget=sometimes": "invalid evaluation.budget='sometimes'",
    "evaluation.curve_longest=-1": "invalid evaluation.curve_longest=-1",
    "evaluation.samples.chars=0": "invalid evaluation.samples.chars=0: must be an integer >= 1",
    "evaluation.samples.temperature=-1": "invalid evaluation.samples.temperature=-1: must be a number >= 0",
}


@pytest.mark.parametrize("override", BAD_VALUES)
def test_invalid_values_are_caught_before_any_work(workspace, tiny_corpus, capsys, monkeypatch, override):
    monkeypatch.setattr("gru_experiments.runs.training.prepare_corpus",
                        lambda *a, **k: pytest.fail("work started despite an invalid value"))
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", override))
    assert BAD_VALUES[override] in line
    assert_untouched(before, fingerprint(workspace))


def test_valid_precisions_pass_to_the_trainer():
    for precision in ["32-true", "bf16-mixed", "16-mixed", "64-true", 32, "bf16"]:
        spec = validate(compose_in(Path("/tmp"), f"trainer.precision={precision}"))
        assert spec.precision == spec.trainer["precision"] == precision


WINDOW_PAST_THE_BLOCK = ("error: invalid data.seq_len=256: model transformer sees at most 128 tokens "
                         "(model.architecture.block_size); set data.seq_len <= 128 or a larger block_size")


@pytest.mark.slow
def test_train_py_refuses_a_transformer_window_longer_than_its_block(workspace, tiny_corpus):
    """Past its block every position of a transformer runs a block of its own: minutes of silence
    on a CPU. Refused in one line before any work (runs/checks.check_model)."""
    before = fingerprint(workspace)
    tiny = [o for o in TINY if not o.startswith("data.seq_len=")]
    result = run_script(workspace, f"data.path={tiny_corpus}", *tiny, "model=transformer", "data.seq_len=256",
                        "trainer.max_steps=3")
    assert result.returncode == 2
    assert error_line(result.stderr) == WINDOW_PAST_THE_BLOCK
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert "model transformer:" not in result.stdout  # the model summary: no work started
    assert_untouched(before, fingerprint(workspace))


@pytest.mark.parametrize("model", ["transformer", "mlp", "ngram"])
def test_only_a_window_that_costs_more_than_a_token_per_prediction_is_refused(model):
    """At its block the transformer trains; the MLP and the n-gram (a finite context, a token per
    prediction) take any window."""
    validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=128"))
    if model == "transformer":
        with pytest.raises(UserError) as info:
            validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=129"))
        assert str(info.value).startswith("invalid data.seq_len=129: model transformer sees at most 128 tokens")
    else:
        validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=4096"))
