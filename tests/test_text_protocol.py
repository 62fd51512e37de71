"""The sampling protocol of the text statistics (study/text_protocol.py): every mode × decoder ×
statistic, the same prompts and seeds everywhere, greedy's identical samples, the numbers recomputed
from the texts it keeps, and the table. sample.py stats=true end to end: tests/test_generation.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gru_experiments.data.corpus import split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import UserError
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.generation import STUDY_PROMPTS
from gru_experiments.study.modes import MODES_BY_CONTEXT
from gru_experiments.study.text_index import TrainingIndex
from gru_experiments.study.text_protocol import (
    DECODERS,
    DRIFT_MODES,
    TextSettings,
    format_text_statistics,
    measure_text,
    sampling_cost,
    share_samples,
)
from gru_experiments.study.text_stats import STATISTICS, text_statistics

SETTINGS = TextSettings(window=8, samples=6, chars=80, seed=3, drift_samples=2, drift_chars=1000)
ALWAYS_DEFINED = {"loop_rate", "copy_32", "line_shape", "reference_bpc"}  # at 80 characters, with a reference


@pytest.fixture(scope="module")
def corpus(small_shakespeare):
    text = small_shakespeare.read_text(encoding="utf-8")
    train, val = split_text(text, 0.9)
    return CharTokenizer.from_text(text), train, val, TrainingIndex(train)


@pytest.fixture(scope="module")
def recurrent_record(corpus):
    tokenizer, _, val, index = corpus
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=8, hidden_size=16, num_layers=1)
    return measure_text(model, tokenizer, index, val, SETTINGS)


@pytest.fixture(scope="module")
def ngram_record(corpus):
    """A counted 5-gram (no training): it writes words, and greedy decoding loops."""
    tokenizer, train, val, index = corpus
    model = NGramLM(tokenizer.vocab_size, order=5).fit(torch.tensor(tokenizer.encode(train)))
    return measure_text(model, tokenizer, index, val, SETTINGS)


def figures_of(record):
    for mode in MODES_BY_CONTEXT:
        for decoder in DECODERS:
            yield f"{mode} {decoder}", record["modes"][mode][decoder]
    for name in ("reference", "floor", "ceiling"):
        yield name, record[name]
    for mode, stretches in record["drift"].items():
        for stretch in stretches:
            yield f"drift {mode} {stretch['start']}", stretch["statistics"]


def test_every_mode_decoder_and_statistic_is_there(recurrent_record):
    record = recurrent_record
    assert list(record["modes"]) == list(MODES_BY_CONTEXT) and list(DECODERS) == [
        "greedy", "temperature_0.8", "top_k_30", "top_p_0.9", "pure"]
    for label, figures in figures_of(record):
        assert list(figures) == list(STATISTICS), label
        for name, figure in figures.items():
            assert set(figure) == {"value", "se"}
            for number in figure.values():
                assert number is None or math.isfinite(number), (label, name, figure)
            if name in ALWAYS_DEFINED:
                assert figure["value"] is not None, (label, name)
    for name in STATISTICS:  # held-out text defines every statistic, with its standard error
        assert record["reference"][name]["value"] is not None and record["reference"][name]["se"] is not None
    # the samples: N of L characters (continuations only), from the same prompts everywhere
    assert record["settings"]["prompts"] == [[prompt, 2] for prompt in STUDY_PROMPTS]
    for mode in MODES_BY_CONTEXT:
        for decoder in DECODERS:
            texts = record["texts"][mode][decoder]
            assert len(texts) == 6 and all(len(text) == 80 for text in texts)
    assert len(record["texts"]["reference"]) == 6 and all(len(t) == 80 for t in record["texts"]["reference"])
    # the drift: stateful and windowed, two stretches of 500 of two generations of 1,000 characters
    assert list(record["drift"]) == list(DRIFT_MODES)
    for mode in DRIFT_MODES:
        assert [len(t) for t in record["texts"]["drift"][mode]] == [1000, 1000]
        assert [(s["start"], s["end"]) for s in record["drift"][mode]] == [(0, 500), (500, 1000)]
    json.dumps(record, allow_nan=False)  # JSON as it is


def test_every_setting_continues_the_same_prompts_with_the_same_seeds(corpus, recurrent_record):
    """Drawn again (without the drift), a setting's texts are the same: its draws depend on its mode,
    decoder, prompts and seed alone; another seed draws other texts."""
    tokenizer, _, val, index = corpus
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=8, hidden_size=16, num_layers=1)
    again = measure_text(model, tokenizer, index, val, TextSettings(window=8, samples=6, chars=80, seed=3,
                                                                    drift_chars=0))
    assert again["texts"]["stateless"] == recurrent_record["texts"]["stateless"]
    assert again["drift"] == {} and again["texts"]["drift"] == {}
    other_seed = measure_text(model, tokenizer, index, val, TextSettings(window=8, samples=6, chars=80, seed=4,
                                                                         drift_chars=0))
    assert other_seed["texts"]["stateless"]["pure"] != recurrent_record["texts"]["stateless"]["pure"]


@pytest.mark.slow
def test_greedy_repeats_one_text_per_prompt(ngram_record):
    for mode in MODES_BY_CONTEXT:
        texts = ngram_record["texts"][mode]["greedy"]
        assert texts[0] == texts[1] and texts[2] == texts[3] and texts[4] == texts[5], mode
        sampled = ngram_record["texts"][mode]["pure"]
        assert len(set(sampled)) == 6
    for mode in ("stateful", "windowed"):  # the 5-gram writes words, and greedy loops on them
        greedy, pure = ngram_record["modes"][mode]["greedy"], ngram_record["modes"][mode]["pure"]
        assert greedy["distinct_2"]["value"] <= 0.5 < pure["distinct_2"]["value"]
        assert greedy["loop_rate"]["value"] == 1.0 and pure["loop_rate"]["value"] == 0.0
    # and, as the study saw, text from the last token alone is noise beside text from the history
    assert (ngram_record["modes"]["stateless"]["pure"]["word_validity"]["value"]
            < ngram_record["modes"]["stateful"]["pure"]["word_validity"]["value"] - 0.2)


def recompute(record: dict, index: TrainingIndex) -> dict:
    """Every figure of a record, from the texts it keeps."""
    texts = record["texts"]
    return {
        "modes": {mode: {decoder: text_statistics(texts[mode][decoder], index, texts["reference"])
                         for decoder in DECODERS} for mode in MODES_BY_CONTEXT},
        "reference": text_statistics(texts["reference"], index, texts["other_reference"]),
        "floor": text_statistics(texts["floor"], index, texts["reference"]),
        "ceiling": text_statistics(texts["ceiling"], index, texts["reference"]),
        "drift": {mode: [text_statistics([t[s["start"]:s["end"]] for t in generations], index,
                                         texts["drift_reference"]) for s in record["drift"][mode]]
                  for mode, generations in texts["drift"].items()},
    }


def test_the_numbers_recompute_from_the_saved_texts(ngram_record, corpus):
    saved = json.loads(json.dumps(ngram_record))
    again = recompute(saved, corpus[3])
    assert again["modes"] == saved["modes"]
    for name in ("reference", "floor", "ceiling"):
        assert again[name] == saved[name], name
    assert again["drift"] == {mode: [s["statistics"] for s in stretches] for mode, stretches in saved["drift"].items()}


def test_the_table(ngram_record):
    table = format_text_statistics(ngram_record)
    lines = table.splitlines()
    assert lines[0].startswith("text statistics: 6 samples of 80 characters per setting")
    assert lines[1] == "(continuations of 'ROMEO: ', 'KING: ', 'FIRST CITIZEN: '; windowed: the last 4 tokens)"
    assert lines[2].split() == ["setting", *STATISTICS]
    labels = [f"{mode} {decoder}" for mode in MODES_BY_CONTEXT for decoder in DECODERS]
    labels += ["reference (validation)", "random (floor)", "looped (ceiling)"]
    assert [line[:26].strip() for line in lines[3:3 + len(labels)]] == labels
    assert "stateful greedy             1.000 ±0.000" in table  # word_validity: a loop of real words
    assert lines[3 + len(labels)].startswith("drift: 2 generations of 1,000 characters, pure sampling")
    assert lines[-2].startswith("0-500") and lines[-1].startswith("500-1000")


def test_a_corpus_the_prompts_do_not_fit_continues_its_own_opening(tiny_corpus):
    text = tiny_corpus.read_text(encoding="utf-8")
    train, val = split_text(text, 0.9)
    tokenizer = CharTokenizer.from_text(text)
    model = NGramLM(tokenizer.vocab_size, order=3).fit(torch.tensor(tokenizer.encode(train)))
    record = measure_text(model, tokenizer, TrainingIndex(train), val,
                          TextSettings(window=4, samples=2, chars=40, drift_chars=0))
    assert record["settings"]["prompts"] == [[val[:8], 2]]
    assert record["modes"]["stateful"]["pure"]["word_validity"]["value"] > 0.3  # its own words, accents and all


def test_cost_and_sharing():
    model = RecurrentLM(5, "gru", embedding_dim=2, hidden_size=3, num_layers=1)
    assert sampling_cost(model, "stateful", 7, 300) == 7 + 299
    assert sampling_cost(model, "stateless", 7, 300) == 300
    assert sampling_cost(model, "windowed", 7, 10, window=8) == 7 + 8 * 9  # the context grows to the window
    assert share_samples(12, STUDY_PROMPTS) == [(p, 4) for p in STUDY_PROMPTS]
    assert share_samples(4, STUDY_PROMPTS) == [(STUDY_PROMPTS[0], 2), (STUDY_PROMPTS[1], 1), (STUDY_PROMPTS[2], 1)]
    assert share_samples(2, STUDY_PROMPTS) == [(STUDY_PROMPTS[0], 1), (STUDY_PROMPTS[1], 1)]


@pytest.mark.parametrize("settings, message", [
    ({"samples": -1}, "invalid evaluation.text.samples=-1: must be an integer from 0 (no text statistics) to "
                      "1,000"),
    ({"chars": 31}, "invalid evaluation.text.chars=31: must be an integer from 32 (copy_32's span) to 100,000"),
    ({"drift_chars": 499},
     "invalid evaluation.text.drift_chars=499: must be 0 (no drift) or an integer from 500 (one stretch) to 100,000"),
    ({"drift_chars": True}, "invalid evaluation.text.drift_chars=True"),
    # Past a sane bound the command would only seem to hang (issue 36): refused before any work.
    ({"samples": 1_000_000_000}, "invalid evaluation.text.samples=1000000000: must be an integer from 0"),
    ({"chars": 100_001}, "invalid evaluation.text.chars=100001"),
    ({"drift_chars": 1_000_000_000}, "invalid evaluation.text.drift_chars=1000000000: must be 0 (no drift) or"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(UserError) as error:
        TextSettings(**{"window": 8, "samples": 12, "chars": 300, "drift_chars": 4000, **settings})
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    TextSettings(window=8, samples=0, chars=32, drift_chars=0)  # the edges: no text statistics, copy_32's span


def test_the_index_is_counted_once_per_training_split_and_cached(tmp_path):
    train = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20
    counted = TrainingIndex.cached(train, tmp_path, order=3)
    [path] = tmp_path.glob("text_index_*_o3_s32.pt")
    written = path.stat().st_mtime_ns
    loaded = TrainingIndex.cached(train, tmp_path, order=3)
    assert path.stat().st_mtime_ns == written  # loaded, not counted again
    sample = "Before we speak any further"
    assert loaded.vocabulary == counted.vocabulary and loaded.judge.bits(sample) == counted.judge.bits(sample)
    path.write_bytes(b"cut short")  # a file that does not load is counted again and replaced
    assert TrainingIndex.cached(train, tmp_path, order=3).judge.bits(sample) == counted.judge.bits(sample)
    assert TrainingIndex.from_state_dict(torch.load(path, weights_only=True)).vocabulary == counted.vocabulary
    TrainingIndex.cached(train + "x", tmp_path, order=3)  # another split, another file
    assert len(list(tmp_path.glob("text_index_*.pt"))) == 2


# --- the text entry inside an evaluation (the end of a run: only the slow trainings reach it) ---------------------

def text_request(tiny_corpus, val_chars: int | None = None, **text):
    """A final evaluation's Request of a counted 3-gram on tiny_corpus, its validation split cut to `val_chars`."""
    from evaluation_helpers import request_of

    from gru_experiments.study.scores import Split

    whole = tiny_corpus.read_text(encoding="utf-8")
    train, val = split_text(whole, 0.9)
    tokenizer = CharTokenizer.from_text(whole)
    train_ids = torch.tensor(tokenizer.encode(train))
    model = NGramLM(tokenizer.vocab_size, order=3).fit(train_ids)
    val = val[:val_chars]
    text = {"samples": 2, "chars": 40, "drift_chars": 0, **text}
    request = request_of(model, Split.of(torch.tensor(tokenizer.encode(val)), tokenizer), 16,
                         {"text": text, "curve_longest": None}, tokenizer=tokenizer, seed=5,
                         train_ids=train_ids, load_text_index=lambda: TrainingIndex(train))
    return request, val


def test_an_evaluation_measures_the_text_as_measure_text_does(tiny_corpus):
    """TextEntry plans a TextPass, whose run is measure_text with the request's seed on the split's own text; the
    summary leaves the texts out (samples.json keeps them) and adds the time the pass took."""
    from gru_experiments.study.evaluation import evaluate

    request, val = text_request(tiny_corpus)
    evaluation = evaluate(request)
    assert "text" in evaluation.plan.owners
    record = evaluation.summary()["text"]
    expected = measure_text(request.model, request.tokenizer, request.load_text_index(), val,
                            TextSettings(window=16, samples=2, chars=40, drift_chars=0, seed=5))
    assert "texts" not in record and "texts" in expected and record["seconds"] > 0
    assert {key: record[key] for key in ("settings", "modes", "reference", "floor", "ceiling", "drift")} == \
           {key: expected[key] for key in ("settings", "modes", "reference", "floor", "ceiling", "drift")}


def test_a_split_shorter_than_a_sample_leaves_the_text_out_with_a_line(tiny_corpus, capsys):
    from gru_experiments.study.evaluation import evaluate

    request, _ = text_request(tiny_corpus, val_chars=200, chars=300)
    evaluation = evaluate(request)
    assert "text" not in evaluation.plan.owners and "text" not in evaluation.summary()
    assert ("text statistics left out: the validation split has 200 characters, fewer than a sample's "
            "evaluation.text.chars=300") in capsys.readouterr().out
