import io
import multiprocessing
import random
import re
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from robustness_helpers import TINY, TRAIN_PY, assert_untouched, compose_in, fail_in_process, fingerprint, start_script

from gru_experiments.data import tokenizers
from gru_experiments.data.tokenizers import (
    CharTokenizer,
    SentencePieceTokenizer,
    build_tokenizer,
    encode_prompt,
    tokenizer_from_state,
)
from gru_experiments.errors import UserError
from gru_experiments.runs.task import load_checkpoint

# Text with everything a play has and SentencePiece's defaults would mangle.
TRICKY = (
    "ROMEO:\nBut soft, what light?\n\n\n"
    "JULIET:\n   Ay me!   \n  \n"
    " leading space and trailing  \n"
    "runs   of    spaces\n\n"
    "end without newline  "
)


def make_words(rng: random.Random, consonants: str, vowels: str, n: int) -> list[str]:
    syllables = [c + v for c in consonants for v in vowels]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def make_play(seed: int, n_lines: int = 3000) -> str:
    """Play-like English text: speaker labels, blank lines, indentation, runs of spaces."""
    rng = random.Random(seed)
    words = make_words(random.Random(0), "bcdfghjklmnpqrstvwxyz", "aeiou", 1500)
    speakers = ["ROMEO", "JULIET", "First Citizen", "KING RICHARD III", "BUT", "WQXZ"]
    lines = []
    for _ in range(n_lines):
        if rng.random() < 0.15:
            lines += ["", rng.choice(speakers) + ":"]
        indent = " " * rng.choice([0, 0, 0, 2, 4])
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.3:
            sentence = sentence.title()
        lines.append(indent + sentence + rng.choice([",", ".", "!", "?", ";", "  ", "'s"]))
    return "\n".join(lines) + "\n"


def make_cyrillic(seed: int, n_lines: int = 3000) -> str:
    """A different alphabet: Cyrillic plus accented Latin, multi-byte in UTF-8."""
    rng = random.Random(seed)
    words = make_words(random.Random(1), "бвгджзклмнпрстфхцчшщ", "аеёиоуыэюя", 1000)
    words += make_words(random.Random(2), "cfnrsz", "éèïüçœ", 300)
    lines = []
    for _ in range(n_lines):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) + rng.choice([".", "…", "!"]))
        if rng.random() < 0.1:
            lines.append("")
    return "\n".join(lines) + "\n"


def save_load(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.fixture(scope="module")
def play_text() -> str:
    return make_play(0)


@pytest.fixture(scope="module")
def small_text() -> str:
    return make_play(3, n_lines=600)


@pytest.fixture(scope="module")
def play_spm(play_text, tmp_path_factory) -> SentencePieceTokenizer:
    return SentencePieceTokenizer.train(play_text, 200, tmp_path_factory.mktemp("spm"))


# --- char ------------------------------------------------------------------

def test_char_round_trip_and_sorted_vocabulary(play_text):
    tok = CharTokenizer.from_text(play_text)
    assert tok.chars == sorted(set(play_text))
    assert tok.vocab_size == len(set(play_text))
    assert tok.decode(tok.encode(play_text)) == play_text
    assert torch.equal(tok.token_char_lengths, torch.ones(tok.vocab_size, dtype=torch.long))


def test_char_unknown_characters():
    tok = CharTokenizer.from_text("abc \n")
    assert tok.unknown_characters("a zebra\n") == ["e", "r", "z"]
    assert tok.unknown_characters("cab") == []
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("abz")


# --- spm -------------------------------------------------------------------

def test_spm_round_trip_tricky_text(play_spm, play_text):
    assert play_spm.vocab_size == 200
    assert play_spm.unknown_characters(TRICKY) == []
    assert play_spm.decode(play_spm.encode(TRICKY)) == TRICKY
    assert play_spm.decode(play_spm.encode(play_text)) == play_text


def test_spm_other_alphabet(tmp_path):
    text = make_cyrillic(1)
    tok = SentencePieceTokenizer.train(text, 200, tmp_path)
    assert tok.vocab_size == 200
    sample = make_cyrillic(2, n_lines=200)
    assert tok.unknown_characters(sample) == []
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.unknown_characters("жQx!") == ["Q", "x"]
    assert tok.unknown_characters(text) == []


def test_spm_literal_space_symbol_is_escaped(tmp_path):
    text = "a\u2581b c\n" * 300 + "hello world\n" * 100
    tok = SentencePieceTokenizer.train(text, 14, tmp_path)
    sample = "a\u2581b c\nhello\u2581\u2581 world"
    assert tok.unknown_characters(sample) == []
    assert tok.decode(tok.encode(sample)) == sample


def test_spm_unknown_characters_and_unk_length(play_spm):
    text = "Romeo é ж"
    assert play_spm.unknown_characters(text) == ["é", "ж"]
    # The stand-ins themselves are not encodable as themselves.
    assert play_spm.unknown_characters(play_spm.newline_standin) == [play_spm.newline_standin]
    ids = play_spm.encode(text)
    assert play_spm.token_char_lengths[ids].sum().item() == len(play_spm.decode(ids)) == len(text)


def test_spm_token_char_lengths_sum(play_spm):
    chunk = make_play(5, n_lines=500)
    ids = play_spm.encode(chunk)
    lengths = play_spm.token_char_lengths
    assert lengths.dtype == torch.long and lengths.shape == (play_spm.vocab_size,)
    assert lengths[0].item() == 1  # <unk>
    assert lengths[torch.tensor(ids)].sum().item() == len(chunk)
    # Also for an arbitrary window of targets, as a metric would see it.
    window = ids[37:311]
    assert lengths[window].sum().item() == len(play_spm.decode(window))


def test_spm_long_lines_are_not_dropped(tmp_path):
    # "ж" occurs only in one line longer than the trainer's default limit.
    text = "ab ba\n" * 500 + "ж" * 5000 + "\n"
    tok = SentencePieceTokenizer.train(text, 8, tmp_path)
    assert tok.unknown_characters("ж") == []


def test_spm_training_is_deterministic_and_quiet(tmp_path, small_text, capfd):
    text = small_text
    a = SentencePieceTokenizer.train(text, 100, tmp_path / "a")
    b = SentencePieceTokenizer.train(text, 100, tmp_path / "b")
    assert a.model_proto == b.model_proto
    assert len(capfd.readouterr().err) < 200


def test_spm_bpe(tmp_path, play_text):
    tok = SentencePieceTokenizer.train(play_text, 150, tmp_path, model_type="bpe")
    assert tok.vocab_size == 150
    assert tok.decode(tok.encode(TRICKY)) == TRICKY


# --- state -----------------------------------------------------------------

def test_char_state_round_trip(play_text):
    tok = CharTokenizer.from_text(play_text)
    rebuilt = tokenizer_from_state(save_load(tok.state_dict()))
    assert isinstance(rebuilt, CharTokenizer)
    assert rebuilt.encode(play_text) == tok.encode(play_text)
    assert rebuilt.chars == tok.chars


def test_spm_state_round_trip_without_cache(tmp_path, small_text, play_text):
    cache = tmp_path / "cache"
    tok = SentencePieceTokenizer.train(small_text, 100, cache)
    state = tok.state_dict()
    assert state["kind"] == "spm"
    for path in cache.iterdir():
        path.unlink()
    rebuilt = tokenizer_from_state(save_load(state))
    assert isinstance(rebuilt, SentencePieceTokenizer)
    assert rebuilt.encode(TRICKY) == tok.encode(TRICKY)
    assert rebuilt.encode(play_text) == tok.encode(play_text)
    assert torch.equal(rebuilt.token_char_lengths, tok.token_char_lengths)
    assert rebuilt.unknown_characters("é\n") == ["é"]


# --- cache -----------------------------------------------------------------

def model_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.model"))


def test_cache_hit_does_not_retrain(tmp_path, small_text, monkeypatch):
    first = SentencePieceTokenizer.train(small_text, 100, tmp_path)
    [path] = model_files(tmp_path)
    mtime = path.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("trainer called on a cache hit")

    monkeypatch.setattr(tokenizers.spm.SentencePieceTrainer, "train", fail)
    second = SentencePieceTokenizer.train(small_text, 100, tmp_path)
    assert second.model_proto == first.model_proto
    assert path.stat().st_mtime_ns == mtime
    assert model_files(tmp_path) == [path]


def test_cache_key_depends_on_text_and_settings(tmp_path, small_text):
    other_text = small_text + "one more line\n"
    SentencePieceTokenizer.train(small_text, 100, tmp_path)
    SentencePieceTokenizer.train(small_text, 101, tmp_path)
    SentencePieceTokenizer.train(small_text, 100, tmp_path, character_coverage=0.9995)
    SentencePieceTokenizer.train(small_text, 100, tmp_path, model_type="bpe")
    SentencePieceTokenizer.train(other_text, 100, tmp_path)
    assert len(model_files(tmp_path)) == 5
    assert not list(tmp_path.glob("*.tmp"))


def _train_in_child(text: str, cache: str) -> bytes:
    return SentencePieceTokenizer.train(text, 100, cache).model_proto


def test_concurrent_training_of_same_key(tmp_path):
    text = make_play(4, n_lines=600)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        protos = list(pool.map(_train_in_child, [text] * 2, [str(tmp_path)] * 2))
    assert protos[0] == protos[1]
    assert len(model_files(tmp_path)) == 1
    assert not list(tmp_path.glob("*.tmp"))


# --- build_tokenizer -------------------------------------------------------

def test_build_tokenizer(tmp_path, play_text):
    char = build_tokenizer("char", play_text, tmp_path)
    assert char.kind == "char" and char.vocab_size == len(set(play_text))
    spm_tok = build_tokenizer("spm", play_text[:20000], tmp_path, vocab_size=100,
                              model_type="unigram", character_coverage=1.0)
    assert spm_tok.kind == "spm" and spm_tok.vocab_size == 100
    with pytest.raises(ValueError, match="'char', 'spm', 'byte'"):
        build_tokenizer("bpe", play_text, tmp_path)
    with pytest.raises(ValueError, match="'char', 'spm', 'byte'"):
        tokenizer_from_state({"kind": "nope"})


# --- full corpus -----------------------------------------------------------

def test_tinyshakespeare_split(tmp_path, shakespeare):
    text = shakespeare.read_text(encoding="utf-8")
    split = int(0.9 * len(text))
    train, val = text[:split], text[split:]
    tok = build_tokenizer("spm", train, tmp_path, vocab_size=1000)
    assert tok.vocab_size == 1000
    assert tok.unknown_characters(val) == []
    ids = tok.encode(val)
    assert tok.decode(ids) == val
    assert tok.token_char_lengths[torch.tensor(ids)].sum().item() == len(val)
    assert len(ids) < len(val) / 2  # subwords actually compress
    # Pieces spanning a line end (":\n") are the point of the newline stand-in.
    assert tok.decode(tok.encode("ROMEO:\n")).endswith(":\n")
    assert any(tok.decode([i]) == ":\n" for i in range(tok.vocab_size))


def test_the_vocabulary_size_an_spm_error_advises_works(tmp_path):
    """Issue 72: "set tokenizer.vocab_size above 5001" on a 5,000-symbol text, where 5,001 is the one size that works
    (SentencePiece's required_chars counts its own pieces too); any other of its errors is one line."""
    symbols = [chr(0x4E00 + i) for i in range(298)]
    text = "".join(symbols) + "\n" + "".join(random.Random(1).choice(symbols) for _ in range(300)) + " x"
    with pytest.raises(tokenizers.UserError) as refused:
        SentencePieceTokenizer.train(text, 200, tmp_path)
    advised = int(re.search(r"set tokenizer.vocab_size=(\d+) or more", str(refused.value))[1])
    assert SentencePieceTokenizer.train(text, advised, tmp_path).vocab_size == advised
    with pytest.raises(tokenizers.UserError, match=r"^SentencePiece could not train on this corpus \(tokenizer."
                                                   r"vocab_size and the text\): it broke; try another"):
        raise tokenizers._vocab_size_error(RuntimeError("Internal: src/trainer.cc\nit broke"))


def test_spm_vocabulary_too_large_for_the_corpus(workspace, tiny_corpus, capsys):
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm",
                                              "tokenizer.vocab_size=500"))
    assert re.fullmatch(r"error: tokenizer\.vocab_size=500 is too large for this corpus: SentencePiece can make at "
                        r"most (\d+) pieces from its training split; set tokenizer\.vocab_size=\1 or lower \(where no "
                        r"size fits both bounds, the text is too small for SentencePiece: use tokenizer=char\)", line)
    assert_untouched(before, fingerprint(workspace))  # no half-trained model in the cache


def test_spm_vocabulary_smaller_than_the_alphabet(workspace, tiny_corpus, capsys):
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm",
                                              "tokenizer.vocab_size=10"))
    assert re.search(r"tokenizer\.vocab_size=10 is too small for this corpus: SentencePiece needs \d+ pieces, one "
                     r"for each distinct character", line)


def test_prompt_with_unknown_characters(tmp_path, capsys):
    char = CharTokenizer.from_text("ROMEO: hello\n")
    with pytest.raises(UserError) as info:
        encode_prompt(char, "ROMEO: héllo ✓", drop_unknown=False)
    assert str(info.value) == ("the prompt has characters this model's char vocabulary lacks: 'é' (U+00E9), "
                               "'✓' (U+2713); remove them, or drop them with drop_unknown=true")
    assert char.decode(encode_prompt(char, "ROMEO: héllo ✓", drop_unknown=True)) == "ROMEO: hllo "
    assert "'é' (U+00E9), '✓' (U+2713)" in capsys.readouterr().err

    spm = SentencePieceTokenizer.train("the cat sat on the mat\n" * 200, 12, tmp_path)
    with pytest.raises(UserError, match=r"spm vocabulary lacks: 'Z' \(U\+005A\)"):
        encode_prompt(spm, "the Zat", drop_unknown=False)  # spm would silently make it <unk>
    assert spm.decode(encode_prompt(spm, "the Zat", drop_unknown=True)) == "the at"


# train.py with the SentencePiece trainer slowed down and every step logged, so the test can
# prove that the two processes overlapped and that only one of them trained.
SLOW_SPM = textwrap.dedent(f"""
    import os, runpy, sys, time
    from gru_experiments.data import corpus as data
    from gru_experiments.data.tokenizers import SentencePieceTokenizer

    def log(event):
        with open(os.environ["SPM_LOG"], "a") as f:
            f.write(f"{{time.time()}} {{os.getpid()}} {{event}}\\n")

    prepared, run_trainer = data.prepared_ids, SentencePieceTokenizer._run_trainer

    def logged_prepared(*args, **kwargs):  # each run asks for the corpus's ids, their tokenizer with them
        log("wants-tokenizer")
        return prepared(*args, **kwargs)

    def slow_trainer(*args, **kwargs):
        log("trains")
        time.sleep(8)  # hold the lock: the other process arrives meanwhile
        return run_trainer(*args, **kwargs)

    data.prepared_ids = logged_prepared
    SentencePieceTokenizer._run_trainer = staticmethod(slow_trainer)
    sys.argv = [{str(TRAIN_PY)!r}, *sys.argv[1:]]
    runpy.run_path({str(TRAIN_PY)!r}, run_name="__main__")
""")


@pytest.mark.slow
def test_runs_started_together_share_one_spm_cache(tmp_path, tiny_corpus):
    """Two train.py processes needing the same, not yet trained SentencePiece model: one trains it (and prepares
    the corpus's ids) while the other waits on the lock, then reads both; the cache holds one valid model."""
    script, log = tmp_path / "slow_spm.py", tmp_path / "spm.log"
    script.write_text(SLOW_SPM)
    args = [f"data.path={tiny_corpus}", *TINY, "tokenizer=spm", "tokenizer.vocab_size=80", "trainer.max_steps=1",
            "model.steps_per_epoch=1"]
    jobs = [start_script(tmp_path, *args, script=script, SPM_LOG=log) for _ in range(2)]
    for process in jobs:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    events = [line.split() for line in log.read_text().splitlines()]
    arrivals = [float(t) for t, _, event in events if event == "wants-tokenizer"]
    trainings = [float(t) for t, _, event in events if event == "trains"]
    assert len(arrivals) == 2 and len(trainings) == 1  # one trained, the other read the cache
    assert max(arrivals) < trainings[0] + 8, "the processes did not overlap; the test proves nothing"

    cache = tmp_path / "data" / "tokenizers"
    models = list(cache.glob("spm-*.model"))
    assert len(models) == 1 and not list(cache.glob("*.tmp"))
    # Both runs used the very model in the cache, and it is a working one.
    tokenizers = [load_checkpoint(p).tokenizer
                  for p in tmp_path.glob("outputs/runs/astra_alpha/*/checkpoints/last.ckpt")]
    assert len(tokenizers) == 2
    assert all(t.model_proto == models[0].read_bytes() for t in tokenizers)
    text = tiny_corpus.read_text()[:2000]
    assert tokenizers[0].vocab_size == 80 and tokenizers[0].decode(tokenizers[0].encode(text)) == text
