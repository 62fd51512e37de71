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
