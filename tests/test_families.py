"""Every family under the one model protocol: the MLP's math against an independent loop, and for
GRU, LSTM, RNN, minGRU, minLSTM, MLP and n-gram alike: the state continues a sequence, stateless
sampling sees only the last token, train.py writes the same outputs and sample.py generates in
every mode; bad settings get one-line errors and leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from robustness_helpers import train

from gru_experiments.errors import UserError
from gru_experiments.models.minrnn import MinRNNLM
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.generation import Decoding, make_chooser, sample_tokens

REPO = Path(__file__).resolve().parents[1]
V = 11


def build(family: str):
    torch.manual_seed(0)
    if family in ("gru", "lstm", "rnn"):
        return RecurrentLM(V, family, embedding_dim=6, hidden_size=8, num_layers=2, dropout=0.0)
    if family in ("mingru", "minlstm"):
        return MinRNNLM(V, family, embedding_dim=6, hidden_size=8, num_layers=2, dropout=0.0)
    if family == "mlp":
        return BengioMLP(V, context=4, embedding_dim=3, hidden_size=7, dropout=0.0, direct=True)
    return NGramLM(V, order=4).fit(torch.randint(0, V - 1, (2000,)))


FAMILIES = ["gru", "lstm", "rnn", "mingru", "minlstm", "mlp", "ngram"]


def test_mlp_matches_the_papers_formula_position_by_position():
    model = BengioMLP(V, context=3, embedding_dim=2, hidden_size=5, dropout=0.0, direct=True).double()
    tokens = torch.randint(0, V, (2, 6))
    logits, state = model(tokens)
    C, H, d = model.embedding.weight, model.hidden.weight, model.hidden.bias
    U, b, W = model.head.weight, model.head.bias, model.direct.weight
    for i in range(2):
        for t in range(6):
            previous = [tokens[i, j].item() if j >= 0 else V for j in range(t - 2, t + 1)]  # V: no token
            x = torch.cat([C[p] for p in previous])
            expected = b + U @ torch.tanh(d + H @ x) + W @ x
            torch.testing.assert_close(logits[i, t], expected)
    assert torch.equal(state, tokens[:, -3:])
    assert model.context == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_the_state_continues_a_sequence(family):
    model = build(family).eval()
    tokens = torch.randint(0, V, (3, 12))
    with torch.no_grad():
        whole, _ = model(tokens)
        first, state = model(tokens[:, :5])
        second, _ = model(tokens[:, 5:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-5, rtol=1e-5)
    assert model.context == {"mlp": 4, "ngram": 3}.get(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_stateless_sampling_depends_on_the_last_token_only(family):
    model = build(family)
    a = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    b = torch.tensor([[9, 8, 0, 0, 2, 1, 7]])  # everything differs but the last token
    samples = [sample_tokens(model, p, 30, "stateless", make_chooser(Decoding(), torch.Generator().manual_seed(3)))
               for p in (a, b)]
    assert torch.equal(samples[0], samples[1])
    with torch.no_grad():  # with its state, the history matters
        assert not torch.allclose(model.eval()(a)[0][:, -1], model(b)[0][:, -1])


def run_sample(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROJECT_ROOT=str(root), PYTHONPATH=str(REPO), WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(REPO / "sample.py"), f"paths.log_dir={root / 'outputs'}",
                           "device=cpu", *overrides], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


TINY_RECIPE = ["data.batch_size=4", "data.seq_len=32", "trainer.max_steps=2", "model.steps_per_epoch=2",
               "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "evaluation.samples.chars=20"]


@pytest.mark.parametrize("model,modes", [("ngram", ["stateful", "stateless", "windowed"]), ("mlp", ["stateless"]),
                                         ("rnn", ["windowed"]), ("mingru", ["stateful"]),
                                         ("minlstm", ["stateless"])])
@pytest.mark.slow
def test_train_writes_a_gru_runs_outputs_and_sample_py_loads_it(compose_config, tiny_corpus, tmp_path, model, modes):
    recipe = [o for o in TINY_RECIPE if model != "ngram" or "steps" not in o]
    cfg = compose_config(f"model={model}", f"data.path={tiny_corpus}", *recipe)
    summary = train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for mode in ("stateful", "stateless", "windowed", "bigram"):
        assert on_disk[f"{mode}_bpc"] > 0 and on_disk[f"{mode}_nll"] > 0
    assert on_disk["family"] == model and on_disk["parameters"] > 0 and summary["status"] == "completed"
    assert (run_dir / "samples.json").is_file() and (run_dir / "history.csv").is_file()
    checkpoint = Path(on_disk["checkpoint"])
    assert checkpoint.is_file()
    for mode in modes:  # the checkpoint alone rebuilds the model: no config files are read
        result = run_sample(tmp_path, f"ckpt={checkpoint}", f"inference={mode}", "prompt='MARÍA: '",
                            "max_new_tokens=15")
        assert result.returncode == 0, result.stderr
        assert f"=== 'MARÍA: ' [{mode}, sample 1/1]" in result.stdout


@pytest.mark.parametrize("model", ["ngram3", "mlp", "rnn"])
def test_every_family_on_sentencepiece_tokens(compose_config, tiny_corpus, model):
    recipe = [] if model.startswith("ngram") else ["trainer.max_steps=3", "data.batch_size=4"]
    cfg = compose_config(f"model={model}", "tokenizer=spm", "tokenizer.vocab_size=80", f"data.path={tiny_corpus}",
                         "data.seq_len=16", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", *recipe)
    summary = train(cfg)
    assert summary["tokenizer"] == "spm" and summary["vocab_size"] == 80
    assert all(summary[f"{mode}_bpc"] > 0 for mode in ("stateful", "stateless", "windowed", "bigram"))
    if model.startswith("ngram"):
        assert summary["stateful_bpc"] < summary["bigram_bpc"]


@pytest.mark.parametrize("overrides,message", [
    (["model=ngram", "model.architecture.order=0"], "invalid model.architecture.order=0: must be an integer >= 1"),
    (["model=mlp", "model.architecture.context=0"], "invalid model.architecture.context=0: must be an integer >= 1"),
    (["model=ngram", "+model.architecture.hidden_size=8"],
     "unknown key model.architecture.hidden_size: NGramLM (ngram) takes order, smoothing"),
    (["model=mlp", "+model.architecture.num_layers=2"], "unknown key model.architecture.num_layers: BengioMLP"),
    (["model=ngram", "+model.lr=0.1"], "model.lr is not a setting of NGramLM"),
    (["model=mlp", "model.architecture.context=100000"], "fewer than one context of mlp"),
    (["model=ngram", "model.architecture.order=100000"], "fewer than one context of ngram"),
])
@pytest.mark.slow
def test_bad_family_settings_fail_in_one_line_and_leave_nothing(compose_config, tiny_corpus, tmp_path, overrides,
                                                                 message):
    cfg = compose_config(*overrides, f"data.path={tiny_corpus}", "trainer.accelerator=cpu")
    with pytest.raises(UserError) as error:
        train(cfg)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,message", [
    (["model=ngram", "+model.lr=0.1"], "model.lr is not a setting of NGramLM (ngram): its weights are counted from "
                                       "the training split, with no optimizer, epochs or steps"),
    (["model=mlp", "model.architecture.context=1000", "data.seq_len=16"],
     "the training split has 900 tokens, fewer than one context of mlp (1000 tokens and the one they predict)"),
    (["model.architecture=null"], "invalid model.architecture: must be a mapping with _target_ and the model's "
                                  "settings"),
], ids=["lr_of_a_counted_model", "context_past_the_split", "no_architecture"])
def test_bad_family_settings_are_refused_by_the_checks_before_any_work(compose_config, tmp_path, overrides,
                                                                        message):
    """The checks the slow test above reaches through train(), called as train() calls them: validate, then the
    sizes against the corpus (1,000 characters here) in prepare, which writes nothing."""
    from conftest import make_text

    from gru_experiments.runs.checks import validate
    from gru_experiments.runs.training import prepare

    corpus = tmp_path / "short.txt"
    corpus.write_text(make_text(1000), encoding="utf-8")
    cfg = compose_config(*overrides, f"data.path={corpus}", "trainer.accelerator=cpu")
    with pytest.raises(UserError) as error:
        prepare(validate(cfg))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_may_only_name_a_family_inside_the_package():
    from gru_experiments.models.protocol import build_model

    with pytest.raises(UserError, match="only classes in gru_experiments"):
        build_model({"_target_": "os.system"}, 5, from_checkpoint=True)
    with pytest.raises(UserError, match="not a LanguageModel"):
        build_model({"_target_": "torch.nn.Linear"}, 5)


@pytest.mark.parametrize("family", ["mlp", "ngram"])
def test_a_finite_context_model_samples_the_same_stateful_and_windowed(family):
    """It sees its last `context` tokens either way (windowed sampling runs only those)."""
    model = build(family)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    stateful, windowed = (sample_tokens(model, prompt, 40, mode,
                                        make_chooser(Decoding(), torch.Generator().manual_seed(5)),
                                        window=50) for mode in ("stateful", "windowed"))
    assert torch.equal(stateful, windowed)
