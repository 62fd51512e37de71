"""The corpus (data/corpus.py), read and checked before any work: a text that cannot train (missing, a folder,
empty, not UTF-8, UTF-16, too short in characters or in tokens) is refused in one line naming what to do, nothing
damaged; a UTF-8 byte-order mark is dropped and Windows line ends are said; data.sha256 is the file's, or names a
shipped corpus. Any UTF-8 text trains with the char tokenizer: its vocabulary is the whole corpus's characters, so a
validation split with characters the training split lacks trains end to end through train.py, every figure finite."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path

import pytest
from robustness_helpers import assert_untouched, compose_in, fail_in_process, fingerprint, run_script

from gru_experiments.data.corpus import (
    SHIPPED_SHA256,
    load_corpus,
    prepare_corpus,
    read_corpus,
    shipped_corpora,
    shipped_name,
)
from gru_experiments.errors import UserError


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


def test_a_utf8_byte_order_mark_is_dropped_with_one_line(tmp_path, compose_config, tiny_corpus, capsys):
    """As Python's utf-8-sig reads it: the mark is no character of the text (it joined the vocabulary, and every
    split boundary moved by it); the corpus's sha256 is still the file's."""
    corpus = tmp_path / "bom.txt"
    corpus.write_bytes(b"\xef\xbb\xbf" + tiny_corpus.read_bytes())
    cfg = compose_config(f"data.path={corpus}")
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tokenizers")
    assert "\ufeff" not in prepared.tokenizer.state_dict()["chars"]
    assert f"corpus {corpus} starts with a UTF-8 byte-order mark: dropped" in capsys.readouterr().out
    assert prepared.sha256 == hashlib.sha256(corpus.read_bytes()).hexdigest()
    plain = compose_config(f"data.path={tiny_corpus}")
    assert prepared.train_ids.equal(prepare_corpus(plain.data, plain.tokenizer, tmp_path / "tokenizers").train_ids)
    assert "byte-order mark" not in capsys.readouterr().out


def test_data_sha256_is_checked_and_never_falls_back_to_tiny_shakespeare(compose_config, tiny_corpus):
    """data.sha256 given: with data.path it must be the file's; without, it must name a shipped corpus (or come with
    data.url): a hash that names nothing was read as Tiny Shakespeare."""
    sha256 = hashlib.sha256(tiny_corpus.read_bytes()).hexdigest()
    assert load_corpus(compose_config(f"data.path={tiny_corpus}", f"data.sha256={sha256}").data).sha256 == sha256
    with pytest.raises(UserError, match=f"corpus file {tiny_corpus} has sha256 {sha256}, but data.sha256={'0' * 64}: "
                                        "it is not the text that hash names"):
        load_corpus(compose_config(f"data.path={tiny_corpus}", f"data.sha256={'0' * 64}").data)
    shipped = ", ".join(f"{shipped_name(path)}: {sha}" for sha, path in shipped_corpora().items())  # whatever ships
    assert SHIPPED_SHA256 in shipped  # the default corpus among them
    for named in ([], ["data=pystdlib"]):
        with pytest.raises(UserError, match=re.escape(f"data.sha256={'1' * 64} names no corpus shipped in the package "
                                                      f"({shipped}), and no data.url")):
            load_corpus(compose_config(*named, f"data.sha256={'1' * 64}").data)
    pystdlib = compose_config("data=pystdlib").data
    assert load_corpus(pystdlib).sha256 == pystdlib.sha256 and load_corpus(pystdlib).source.name == "pystdlib.txt.xz"


@pytest.fixture(scope="module")
def bad_corpora(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    files = {"empty": b"", "latin1": "Ce soir-là, à l'été\n".encode("latin-1") * 50, "short": b"To be, or not."}
    for name, data in files.items():
        (folder / f"{name}.txt").write_bytes(data)
    return {name: folder / f"{name}.txt" for name in files} | {"missing": folder / "missing.txt",
                                                                 "folder": folder}


@pytest.mark.parametrize("case, expected", [
    ("missing", r"corpus file not found: .*missing\.txt \(data\.path\)"),
    ("folder", r"corpus path is not a file"),
    ("empty", r"corpus file is empty: .*empty\.txt"),
    ("latin1", r"corpus file is not UTF-8 text: .*latin1\.txt \(byte 0xe0 at offset 9, line 1; convert it"),
    ("short", r"corpus too short: the training split of .*short\.txt has 12 characters, fewer than one training "
              r"window plus one \(data\.seq_len \+ 1 = 33\)"),
])
def test_bad_corpus(workspace, bad_corpora, capsys, case, expected):
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={bad_corpora[case]}"))
    assert re.search(expected, line), line
    assert_untouched(before, fingerprint(workspace))


def test_too_short_in_tokens_after_subword_encoding(workspace, tiny_corpus, capsys):
    # 20,000 characters are long enough in characters but not in SentencePiece tokens.
    cfg = compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm", "tokenizer.vocab_size=60",
                     "data.seq_len=17000")
    assert re.search(r"training split of .* has \d+ tokens, fewer than one training window plus one",
                     fail_in_process(capsys, cfg))


def test_validation_split_with_characters_the_training_split_lacks_is_accepted(tmp_path, workspace):
    # Refused once; now the char vocabulary is the whole corpus's characters (the slow test at the end of this
    # file trains such a corpus end to end).
    corpus = tmp_path / "new_chars.txt"
    corpus.write_text("abc " * 300 + "xyz€")
    cfg = compose_in(workspace, f"data.path={corpus}")
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok")
    assert prepared.tokenizer.chars == sorted("abc xyz€")


# --- any UTF-8 text trains with the char tokenizer --------------------------------------------------------------------

NEW_CHARACTERS = "é½\tcf"  # "café" brings c and f too


def corpus_with_new_characters_at_the_end(n_chars: int = 12_000) -> str:
    """ASCII lines for the first 90%; the last 10% also uses 'é', '½', a tab, 'c' and 'f'."""
    rng = random.Random(0)
    words = ["the", "king", "shall", "speak", "now", "and", "then", "go", "home", "night"]

    def lines(extra: list[str], n: int) -> str:
        out = []
        while sum(map(len, out)) < n:
            out.append(" ".join(rng.choice(words + extra) for _ in range(rng.randint(3, 9))) + ".\n")
        return "".join(out)[:n]

    head = lines([], int(n_chars * 0.9) + 1)
    tail = lines(["café", "½", "\tthe"], n_chars - len(head))
    return head + tail


@pytest.fixture(scope="module")
def new_chars_corpus(tmp_path_factory) -> Path:
    text = corpus_with_new_characters_at_the_end()
    cut = int(len(text) * 0.9)
    assert set(text[cut:]) - set(text[:cut]) == set(NEW_CHARACTERS)  # the premise of every test here
    path = tmp_path_factory.mktemp("corpus") / "new_chars.txt"
    path.write_text(text, encoding="utf-8")
    return path


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.parametrize("model", ["astra_alpha", "ngram3"])
@pytest.mark.slow
def test_a_corpus_whose_validation_split_has_new_characters_trains_end_to_end(tmp_path, new_chars_corpus, model):
    result = run_script(tmp_path, f"model={model}", f"data.path={new_chars_corpus}", "data.train_fraction=0.9",
                        "preset=smoke", "logger=none", "trainer.accelerator=cpu", "evaluation.samples.chars=20")
    assert result.returncode == 0, result.stderr[-3000:]
    [summary_file] = (tmp_path / "outputs").rglob("summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary.get("status") != "failed", summary
    text = new_chars_corpus.read_text(encoding="utf-8")
    assert summary["vocab_size"] == len(set(text))  # the whole corpus's characters, the new ones included
    for mode in ("stateful", "stateless", "windowed", "bigram"):
        for unit in ("nll", "bpc"):
            assert finite(summary[f"{mode}_{unit}"]) and summary[f"{mode}_{unit}"] > 0, (mode, unit, summary)
    assert finite(summary["val_bpc"])
    curve = {k: v for k, v in summary["context_curve"].items() if k not in ("settings", "by_class")}
    assert curve and all(finite(v) for v in curve.values()), curve
