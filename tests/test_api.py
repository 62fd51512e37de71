"""The Python API (gru_experiments/api.py): train, load, generate, score, and its one-line errors.

One tiny model is trained for the whole module (preset=smoke, a few steps, into a tmp root);
every figure is checked against the functions train.py, sample.py and evaluation.py use."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_sample import two_runs  # noqa: F401 (a fixture: a two-step run, and its copy in a second run folder)

import gru_experiments
from gru_experiments.errors import UserError
from gru_experiments.files import finite_or_null

STEPS = 6
OVERRIDES = ["preset=smoke", "logger=none", f"trainer.max_steps={STEPS}", "checkpoint.every_n_steps=0"]
STAMP = re.compile(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6}")
TEXT = "KING RICHARD III:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_root")
    summary = gru_experiments.train(OVERRIDES, root=root)
    return root, summary


@pytest.fixture(scope="module")
def lm(trained):
    return gru_experiments.load(trained[1]["run_dir"])


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


# --- train -----------------------------------------------------------------------------------
def test_train_writes_the_run_folder_train_py_writes(trained):
    from gru_experiments.runs.run_dir import RunDir, find_checkpoint

    root, summary = trained
    assert summary["status"] == "completed" and summary["model"] == "astra_alpha"
    assert summary["train_steps"] == STEPS
    run = RunDir(summary["run_dir"])
    assert run.path.parent == root.resolve() / "outputs" / "runs" / "astra_alpha"
    assert STAMP.fullmatch(run.path.name)
    for name in ("summary.json", "samples.json", "history.csv", "checkpoints/last.ckpt",
                 ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"):
        assert (run.path / name).is_file(), name
    assert run.summary() == finite_or_null(summary)  # the file writes a figure that is not finite as null
    assert list(OmegaConf.load(run.path / ".hydra" / "overrides.yaml")) == [*OVERRIDES,
                                                                          f"paths.root_dir={root.resolve()}"]
    assert run.config().data.seq_len == 32 and run.config().model.name == "astra_alpha"
    # train.log is created by its first line; this run logs none (Lightning's one line, "weights_only was not set",
    # went with issue 74: every save says what it saves). A resume's lines: test_train_under_project_root_and_resume
    # sample.py (and resume=last) find it as the newest astra_alpha run under outputs/.
    assert find_checkpoint("astra_alpha", root / "outputs") == run.last_checkpoint()


def test_train_under_project_root_and_resume(trained, tmp_path, monkeypatch):
    """Without root= the run goes under $PROJECT_ROOT, as train.py's; resume=last continues an
    interrupted run in its own folder, as train.py resume=last does."""
    from gru_experiments.runs.run_dir import RunDir

    _, summary = trained
    copy = tmp_path / "outputs" / "runs" / "astra_alpha" / Path(summary["run_dir"]).name
    shutil.copytree(summary["run_dir"], copy)
    (copy / "summary.json").unlink()  # interrupted: a checkpoint and no summary
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    resumed = gru_experiments.train(["resume=last"])
    assert Path(resumed["run_dir"]) == copy and resumed["resumed_from_step"] == STEPS
    assert list(copy.glob(".hydra/resumed_*/overrides.yaml")) and RunDir(copy).finished
    assert "lightning" in (copy / "train.log").read_text(encoding="utf-8")  # its log, as train.py's: Restoring states


def test_train_errors_are_one_line_and_leave_nothing(tmp_path):
    assert "model/no_such_model" in one_line_error(gru_experiments.train, ["model=no_such_model"], root=tmp_path)
    one_line_error(gru_experiments.train, ["no_such_key=1"], root=tmp_path)
    assert "trainer.max_steps=0" in one_line_error(gru_experiments.train, ["trainer.max_steps=0", "logger=none"],
                                                   root=tmp_path)
    one_line_error(gru_experiments.train, "model=astra_beta", root=tmp_path)  # a string, not a list
    assert "resume=last" in one_line_error(gru_experiments.train, ["resume=last"], root=tmp_path)
    assert not (tmp_path / "outputs" / "runs").exists()


def test_train_quotes_a_root_hydra_would_not_parse_and_refuses_to_run_inside_hydra(tmp_path):
    # A root Hydra's override grammar would not parse (a quote, a comma) is quoted: it composes, and the run is
    # refused for its own bad value, before anything is written.
    root = tmp_path / "it's, mine"
    assert one_line_error(gru_experiments.train, ["trainer.max_steps=0", "logger=none"], root=root).startswith(
        "invalid trainer.max_steps=0: must be -1 (no limit) or an integer >= 1")
    assert not (root / "outputs" / "runs").exists()
    from hydra import initialize_config_dir

    from gru_experiments.api import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert one_line_error(gru_experiments.train, ["logger=none"]) == (
            "train() composes its own config; call it outside a Hydra app or initialize() block")


# --- load ------------------------------------------------------------------------------------
def test_load_a_run_folder_a_checkpoint_or_the_summary(trained, lm, tmp_path):
    _, summary = trained
    run_dir = Path(summary["run_dir"])
    assert lm.name == "astra_alpha" and lm.run_dir == run_dir and lm.seq_len == 32
    assert lm.checkpoint == (run_dir / "checkpoints" / "last.ckpt").resolve()
    assert lm.tokenizer.vocab_size == 65 and not lm.model.training and lm.summary == finite_or_null(summary)
    for source in (run_dir / "checkpoints" / "last.ckpt", str(run_dir), summary):
        other = gru_experiments.load(source)
        assert other.run_dir == run_dir and other.seq_len == 32
        assert all(torch.equal(a, b) for a, b in zip(lm.model.state_dict().values(),
                                                      other.model.state_dict().values()))
    # A checkpoint outside any run folder: no run, no recorded window.
    bare = tmp_path / "model.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", bare)
    alone = gru_experiments.load(bare)
    assert alone.run_dir is None and alone.seq_len is None and alone.summary is None
    # Its repr says what it is and where it came from: the run folder, else the checkpoint.
    assert repr(lm) == (f"TrainedModel('astra_alpha': gru, char tokenizer, vocabulary 65, seq_len 32, "
                        f"from {str(run_dir)!r})")
    assert repr(alone).endswith(f"seq_len None, from {str(bare.resolve())!r})")
    assert "window=N" in one_line_error(alone.generate, "KING: ", "windowed", max_new_tokens=3)
    assert alone.generate("KING: ", "windowed", window=4, max_new_tokens=3, seed=1) == \
        lm.generate("KING: ", "windowed", window=4, max_new_tokens=3, seed=1)


def test_load_errors_are_one_line(tmp_path):
    one_line_error(gru_experiments.load, tmp_path / "missing")
    assert "no checkpoint" in one_line_error(gru_experiments.load, tmp_path)  # a folder without one
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    one_line_error(gru_experiments.load, junk)
    one_line_error(gru_experiments.load, 42)
    one_line_error(gru_experiments.load, {"status": "failed"})


# --- generate --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["stateful", "stateless", "windowed"])
def test_generate_is_seeded_and_continues_the_prompt(lm, mode):
    text = lm.generate("ROMEO: ", mode, max_new_tokens=20, seed=7)
    assert text.startswith("ROMEO: ") and len(text) == len("ROMEO: ") + 20  # one character per token
    assert lm.generate("ROMEO: ", mode, max_new_tokens=20, seed=7) == text
    assert lm.generate("ROMEO: ", mode, max_new_tokens=20, seed=8) != text
    texts = lm.generate("ROMEO: ", mode, max_new_tokens=20, seed=7, num_samples=3)
    assert isinstance(texts, list) and len(texts) == 3 and all(t.startswith("ROMEO: ") for t in texts)
    assert len(set(texts)) == 3 and lm.generate("ROMEO: ", mode, max_new_tokens=20, seed=7, num_samples=3) == texts
    assert lm.generate("ROMEO: ", mode, max_new_tokens=5, greedy=True) == \
        lm.generate("ROMEO: ", mode, max_new_tokens=5, greedy=True, seed=99)


def test_generate_is_sample_py_sampler(lm):
    """The same sampler as sample.py: with sample.py's per-prompt seed, its very text."""
    from gru_experiments.study.generation import Decoding, prompt_seed, sample_texts

    decoding = Decoding(temperature=0.8, top_k=20, top_p=0.9)
    for mode in ("stateful", "stateless", "windowed"):
        [[expected]] = sample_texts(lm.model, lm.tokenizer, ["KING: "], mode=mode, max_new_tokens=30,
                                    decoding=decoding, seed=1234, window=32 if mode == "windowed" else None)
        assert lm.generate("KING: ", mode, max_new_tokens=30, temperature=0.8, top_k=20, top_p=0.9,
                           seed=prompt_seed(1234, "KING: ")) == expected


def test_stateless_depends_on_the_last_prompt_token_only(lm):
    a = lm.generate("ROMEO: ", "stateless", max_new_tokens=40, seed=3)
    b = lm.generate("FIRST CITIZEN: ", "stateless", max_new_tokens=40, seed=3)
    assert a[len("ROMEO: "):] == b[len("FIRST CITIZEN: "):]
    # ... as does windowed with a window of one token.
    assert lm.generate("ROMEO: ", "windowed", window=1, max_new_tokens=40, seed=3) == a


# --- score -----------------------------------------------------------------------------------
def test_score_is_evaluation_py(lm):
    from gru_experiments.study.scores import Split, score_stateful, score_stateless, score_windowed

    split = Split.of(torch.tensor(lm.tokenizer.encode(TEXT)), lm.tokenizer)
    expected = {"stateful": score_stateful(lm.model, split, 32, streams=1),
                "stateless": score_stateless(lm.model, split),
                "windowed": score_windowed(lm.model, split, 32)}
    for mode, reference in expected.items():
        score = lm.score(TEXT, mode)
        assert score.mode == mode and score.window == (32 if mode == "windowed" else None)
        assert (score.nll_sum, score.nll, score.bpc) == (reference.nll_sum, reference.nll, reference.bpc)
        assert score.tokens == len(TEXT) - 1 and score.characters == len(TEXT) - 1  # the first is context
        assert score.bpc == pytest.approx(score.nll_sum / (score.characters * math.log(2)), rel=1e-12)
        assert score.nll == pytest.approx(score.nll_sum / score.tokens, rel=1e-12)
        assert score.to_dict()["bpc"] == score.bpc
    # A window of one token is the stateless figure; a window longer than the text the stateful one.
    assert lm.score(TEXT, "windowed", window=1).bpc == pytest.approx(lm.score(TEXT, "stateless").bpc, abs=1e-5)
    assert lm.score(TEXT, "windowed", window=len(TEXT)).bpc == pytest.approx(lm.score(TEXT, "stateful").bpc,
                                                                             abs=1e-5)


def test_score_of_the_validation_split_is_the_summary_figure(trained, lm):
    """The stateless figure is exact in evaluation.py too: the API's score of the run's validation
    text is summary.json's stateless_bpc."""
    from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text

    _, summary = trained
    _, val_text = split_text(read_corpus(SHIPPED_CORPUS), 0.995)  # preset=smoke's data.train_fraction
    score = lm.score(val_text, "stateless")
    assert score.tokens == len(val_text) - 1
    assert score.bpc == pytest.approx(summary["stateless_bpc"], rel=1e-9)
    assert score.nll == pytest.approx(summary["stateless_nll"], rel=1e-9)


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_score_dynamic_is_study_dynamic_and_leaves_the_weights(lm):
    """mode="dynamic": study/dynamic.score_dynamic on one stream, with the settings given; lr=0 the stateful
    figure; the weights the trained ones after it, and after generate(mode="dynamic")."""
    from gru_experiments.study.dynamic import DynamicSettings, score_dynamic
    from gru_experiments.study.evaluation import DEFAULT_EVALUATION
    from gru_experiments.study.scores import Split

    before = [p.detach().clone() for p in lm.model.parameters()]
    split = Split.of(torch.tensor(lm.tokenizer.encode(TEXT)), lm.tokenizer)
    score = lm.score(TEXT, "dynamic", lr=0.01, decay=0.1, segment=8, rule="sgd", reset_every=None, params="head")
    asked = DynamicSettings.of({"rule": "sgd", "lr": 0.01, "decay": 0.1, "segment": 8, "params": "head"},
                               DEFAULT_EVALUATION)
    assert score.nll_sum == score_dynamic(lm.model, split, asked, 1).score.nll_sum
    assert score.dynamic["segment"] == 8 and score.dynamic["params"] == "head" and score.tokens == len(TEXT) - 1
    assert lm.score(TEXT, "dynamic", lr=0.0).bpc == pytest.approx(lm.score(TEXT, "stateful").bpc, abs=1e-6)
    text = lm.generate(TEXT, "dynamic", max_new_tokens=20, seed=7, lr=0.05, segment=8, rule="sgd")
    assert text.startswith(TEXT) and lm.generate(TEXT, "dynamic", max_new_tokens=20, seed=7, lr=0.05,
                                                 segment=8, rule="sgd") == text
    assert lm.score(TEXT, "dynamic").dynamic["rule"] == "rms"  # the defaults: rms, its statistics on the run's split
    assert lm.generate(TEXT, "dynamic", max_new_tokens=20, seed=7, lr=0.0) == \
        lm.generate(TEXT, "stateful", max_new_tokens=20, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(before, lm.model.parameters()))
    assert "segment=500: longer than" in one_line_error(lm.score, TEXT, "dynamic", segment=500)
    assert "lr=-1" in one_line_error(lm.score, TEXT, "dynamic", lr=-1)
    assert 'mode="dynamic"' in one_line_error(lm.score, TEXT, "stateful", lr=0.1)
    assert "unknown key" in one_line_error(lm.score, TEXT, "dynamic", momentum=0.9)
    assert all(torch.equal(a, b) for a, b in zip(before, lm.model.parameters()))


# --- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    (dict(mode="bogus"), "bogus"),
    (dict(temperature="hot"), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=1000), "top_k"),
    (dict(top_p=0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(num_samples=0), "num_samples"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(mode="windowed", window=0), "window"),
    (dict(seed="x"), "seed"),
    (dict(greedy="yes"), "greedy"),
    (dict(num_samples=10**9), "memory"),  # generation.generate's up-front check
])
def test_generate_refuses_bad_settings_in_one_line(lm, kwargs, fragment):
    """The rules are generation.validate_sampling's, shared with sample.py."""
    assert fragment in one_line_error(lm.generate, "KING: ", **{"max_new_tokens": 3, **kwargs})


def test_generate_refuses_characters_the_vocabulary_lacks(lm):
    assert "drop_unknown=True" in one_line_error(lm.generate, "KING ☃: ", max_new_tokens=3)
    assert one_line_error(lm.generate, b"KING: ", max_new_tokens=3) == "the prompt must be a string, got bytes"
    assert lm.generate("KING ☃: ", max_new_tokens=3, drop_unknown=True).startswith("KING : ")


def test_score_refuses_bad_input_in_one_line(lm):
    assert "bogus" in one_line_error(lm.score, TEXT, "bogus")
    assert "2" in one_line_error(lm.score, "K")
    one_line_error(lm.score, "")
    assert "lacks" in one_line_error(lm.score, "KING ☃ RICHARD")
    assert "window" in one_line_error(lm.score, TEXT, "windowed", window=0)
    assert one_line_error(lm.score, [TEXT]) == "the text must be a string, got list"


# --- the package ---------------------------------------------------------------------------
def test_import_stays_light_and_exports_lazily():
    code = ("import sys, gru_experiments as g; assert 'torch' not in sys.modules and 'hydra' not in sys.modules; "
            "assert callable(g.load) and callable(g.train) and g.TrainedModel and g.TextScore; "
            "assert 'torch' not in sys.modules; assert set(g.__all__) <= set(dir(g)); print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    with pytest.raises(AttributeError):
        gru_experiments.no_such_name


def test_the_python_api_takes_the_same_devices(two_runs):  # noqa: F811 (the fixture)
    from gru_experiments import load

    with pytest.raises(UserError, match="^device=banana: not a device"):
        load(two_runs[1], device="banana")
