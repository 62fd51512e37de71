"""runs/checks.py's command-line rules without a subprocess (train.py's own runs of them are slow-marked): a key
added with + that nothing reads, and one model a run."""

import pytest
from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.runs.checks import check_added_keys, check_choices

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
