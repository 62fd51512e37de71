"""Inputs of issue 53 that were accepted without a word or answered with a misleading line: each now gets one line
that names what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from gru_experiments.data.corpus import prepare_corpus, read_corpus
from gru_experiments.errors import UserError
from gru_experiments.runs.checks import validate


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"])  # with a byte-order mark, and without one
def test_a_utf16_corpus_is_advised_utf16_not_latin1(tmp_path, encoding):
    corpus = tmp_path / "utf16.txt"
    corpus.write_bytes("To be, or not to be: that is the question.\n".encode(encoding) * 50)
    with pytest.raises(UserError, match=r"looks like UTF-16 .* iconv -f utf-16 -t utf-8"):
        read_corpus(corpus)


def test_a_crlf_corpus_says_that_carriage_returns_join_the_vocabulary(tmp_path, compose_config, tiny_corpus, capsys):
    corpus = tmp_path / "crlf.txt"
    corpus.write_bytes(Path(tiny_corpus).read_bytes().replace(b"\n", b"\r\n"))
    cfg = compose_config(f"data.path={corpus}")
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tokenizers")
    assert "\r" in prepared.tokenizer.decode(prepared.train_ids[:200].tolist())
    out = capsys.readouterr().out
    assert "has Windows line ends" in out and "\\r is a character of its own" in out and "dos2unix" in out
    cfg = compose_config(f"data.path={tiny_corpus}")
    prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tokenizers")
    assert "Windows line ends" not in capsys.readouterr().out


def test_a_recall_weight_without_the_probe_says_it_has_no_effect(compose_config, capsys):
    validate(compose_config("training.recall_weight=5"))
    assert "training.recall_weight=5 has no effect without probe=recall" in capsys.readouterr().out
    validate(compose_config("training.recall_weight=5", "probe=recall"))
    validate(compose_config())
    assert "has no effect" not in capsys.readouterr().out


def test_a_long_prompt_is_cut_in_the_progress_bars_label():
    from gru_experiments.runs.sampling import shown_prompt

    assert shown_prompt("ROMEO: ") == "'ROMEO: '"
    label = shown_prompt("x" * 100_000)
    assert len(label) < 80 and label.endswith("(100,000 characters)")
