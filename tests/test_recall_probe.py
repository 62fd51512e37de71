"""The planted-recall probe (probe=recall, data/recall_probe.py): pairs where the record says, the text
untouched around them, balanced distances, a fresh planting every training pass, enough validation
targets, the symbols the corpus lacks, the batches reading each pass's ids, and the config's checks."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import make_text
from omegaconf import OmegaConf
from robustness_helpers import TINY, assert_untouched, error_line, fingerprint, run_script

from gru_experiments.data.batches import CorpusDataModule, RandomWindowBatches, StreamBatches
from gru_experiments.data.corpus import prepare_corpus, split_text
from gru_experiments.data.recall_probe import (
    KEY_CHARS,
    MARKERS,
    NEEDS_CHAR,
    PlantedSplit,
    ProbeSettings,
    SymbolIds,
    plant,
    planting_generator,
    probe_symbols,
    targets_per_distance,
    validation_plantings,
)
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import UserError
from gru_experiments.runs.config import validate

SETTINGS = ProbeSettings(keys=5, distances=(3, 10, 40), gap=8, min_targets=30)


def tokenized(text: str, keys: int = 5):
    symbols = probe_symbols(text, keys)
    tokenizer = CharTokenizer.from_text(text + symbols.opening + symbols.closing + "".join(symbols.keys))
    return torch.tensor(tokenizer.encode(text)), SymbolIds.of(symbols, tokenizer)


def scan_pairs(ids: list[int], opening: int, closing: int) -> list[tuple[int, int, int, int]]:
    """(first key, recalled key, distance, key) of every pair, found by reading the ids alone."""
    pairs, i = [], 0
    while opening in ids[i:]:
        o = ids.index(opening, i)
        c = ids.index(closing, o)
        assert ids[o + 1] == ids[c + 1], "the two keys of a pair differ"
        pairs.append((o + 1, c + 1, c - o - 2, ids[o + 1]))
        i = c + 2
    return pairs


# --- a planting --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairs_are_where_the_record_says_and_the_text_around_them_is_untouched(seed):
    ids, symbols = tokenized(make_text(6000, seed))
    planting = plant(ids, SETTINGS, symbols, planting_generator(seed, "train", 0))
    planted = planting.ids.tolist()
    assert len(planted) == ids.numel()  # cut to the plain split's length
    pairs = scan_pairs(planted, symbols.opening, symbols.closing)
    assert len(pairs) == planting.recall.numel() > 50
    assert [p[0] for p in pairs] == planting.first_key.tolist()
    assert [p[1] for p in pairs] == planting.recall.tolist()
    assert [p[2] for p in pairs] == planting.distances.tolist()
    assert [p[3] for p in pairs] == planting.keys.tolist()
    assert set(planting.distances.tolist()) <= set(SETTINGS.distances)
    assert set(planting.keys.tolist()) <= set(symbols.keys.tolist())
    # Probe symbols appear only in the pairs (4 a pair) ...
    probe_ids = {symbols.opening, symbols.closing, *symbols.keys.tolist()}
    assert sum(t in probe_ids for t in planted) == 4 * len(pairs)
    # ... and without them the planted split is the plain text, cut.
    dropped = {q for first, recall, _, _ in pairs for q in (first - 1, first, recall - 1, recall)}
    text = [t for q, t in enumerate(planted) if q not in dropped]
    assert text == ids[: len(text)].tolist()
    # Sparse and never overlapping: [gap, 2 gap] plain tokens before every pair.
    ends = [-1] + [recall for _, recall, _, _ in pairs]
    gaps = [first - 1 - (end + 1) for (first, _, _, _), end in zip(pairs, ends)]
    assert all(SETTINGS.gap <= g <= 2 * SETTINGS.gap for g in gaps), gaps


def test_distances_are_balanced_and_keys_spread():
    settings = ProbeSettings(keys=16, gap=64)
    ids, symbols = tokenized(make_text(200_000), keys=16)
    planting = plant(ids, settings, symbols, planting_generator(0, "train", 0))
    counts = targets_per_distance([planting], settings.distances)
    assert max(counts) - min(counts) <= 1 and min(counts) > 40  # a prefix of whole shuffled cycles
    assert len(set(planting.keys.tolist())) == 16
    first_of_each_cycle = planting.distances[: 7 * 5].view(5, 7)
    assert all(sorted(row.tolist()) == list(settings.distances) for row in first_of_each_cycle)
    assert len({tuple(row.tolist()) for row in first_of_each_cycle}) > 1  # shuffled afresh each cycle


def test_a_million_tokens_are_planted_in_well_under_a_second():
    ids, symbols = tokenized("abcdefghij klmnop\n" * 56_000)
    assert ids.numel() > 1_000_000
    took = []
    for p in range(3):
        start = time.perf_counter()
        planting = plant(ids, ProbeSettings(), symbols, planting_generator(0, "train", p))
        took.append(time.perf_counter() - start)
    assert planting.ids.numel() == ids.numel() and min(took) < 0.5, took


# --- the training split: a fresh planting every pass ---------------------------------------------
def test_the_training_split_is_planted_afresh_every_pass_and_the_same_for_the_same_seed():
    ids, symbols = tokenized(make_text(20_000))
    split = PlantedSplit(ids, SETTINGS, symbols, seed=3)
    first, second = split.planting(0), split.planting(1)
    assert not torch.equal(first.ids, second.ids)
    assert first.first_key.tolist() != second.first_key.tolist()[: first.first_key.numel()]
    assert first.keys.tolist() != second.keys.tolist()[: first.keys.numel()]
    again = PlantedSplit(ids, SETTINGS, symbols, seed=3)
    assert torch.equal(again.ids_for_pass(1), second.ids) and torch.equal(again(0), first.ids)
    assert not torch.equal(PlantedSplit(ids, SETTINGS, symbols, seed=4)(0), first.ids)
    # Planting p of a split: the validation split's planting 0 is another draw than the training split's.
    assert planting_generator(3, "train", 0).initial_seed() != planting_generator(3, "validation", 0).initial_seed()


def test_window_batches_read_each_epochs_planting_and_resume_in_the_same_epoch():
    ids = torch.arange(400)
    source = lambda p: ids + 1000 * p  # noqa: E731 - pass p's ids say which pass they are
    batches = RandomWindowBatches(ids, 4, 8, steps=3, generator=torch.Generator().manual_seed(0), pass_ids=source)
    for epoch in range(3):
        assert all(int(x.min()) // 1000 == int(x.max()) // 1000 == epoch for x, _ in batches)
    plain = RandomWindowBatches(ids, 4, 8, steps=3, generator=torch.Generator().manual_seed(0))
    planted = RandomWindowBatches(ids, 4, 8, steps=3, generator=torch.Generator().manual_seed(0), pass_ids=source)
    for _ in range(2):  # the draws are those without a source
        assert all(torch.equal(a + 1000 * planted.epoch, b) for (a, _), (b, _) in zip(plain, planted))
    # A resume in the middle of epoch 1 reads epoch 1's planting, then epoch 2's.
    batches = RandomWindowBatches(ids, 4, 8, steps=3, generator=torch.Generator().manual_seed(0), pass_ids=source)
    list(batches)  # epoch 0
    reader = iter(batches)
    next(reader)
    state = batches.state_dict()
    assert (state["epoch"], state["read"]) == (1, 1)
    resumed = RandomWindowBatches(ids, 4, 8, steps=3, generator=torch.Generator(), pass_ids=source)
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed][:2]  # Lightning stops the resumed epoch after its 2 remaining batches
    assert [torch.equal(a, b) for a, b in zip(rest, [x for x, _ in reader])] == [True, True]
    assert int(next(iter(resumed))[0].min()) // 1000 == 2


def test_streams_read_each_passes_planting():
    ids = torch.arange(1000)
    reader = StreamBatches(ids, 4, 10, steps=10_000, seed=0, pass_ids=lambda p: ids + 10_000 * p)
    for inputs, targets, starts_pass in reader:
        if reader.pass_index == 3:
            break
        expected = reader.pass_index - (reader.chunk == 0)  # the pass this batch belongs to
        assert int(inputs.min()) // 10_000 == int(targets.max()) // 10_000 == expected


def test_the_data_module_trains_on_the_probes_planting_and_validates_on_the_plain_split(tmp_path, tiny_corpus):
    corpus = prepare_corpus(data_cfg(tiny_corpus), OmegaConf.create({"kind": "char"}), tmp_path, SETTINGS, seed=1)
    probe = corpus.probe
    for batching in ("windows", "streams"):
        data = CorpusDataModule(corpus.train_ids, corpus.val_ids, 4, 16, 5, seed=1, batching=batching, probe=probe)
        data.setup("fit")
        assert data.probe is probe
        inputs = torch.cat([b[0].flatten() for b in data.train_dataloader()])
        planted = probe.train.ids_for_pass(0)
        assert set(inputs.tolist()) <= set(planted.tolist())
        assert torch.isin(inputs, probe.symbol_ids.keys).any()  # the windows see planted keys
        assert torch.equal(torch.cat([x.flatten() for x, _ in data.val_dataloader()])[: corpus.val_ids.numel() - 1],
                           corpus.val_ids[:-1])


# --- the validation split --------------------------------------------------------------------------
def test_validation_plantings_give_every_distance_its_targets_with_as_few_plantings_as_will_do():
    ids, symbols = tokenized(make_text(3000))
    plantings = validation_plantings(ids, SETTINGS, symbols, seed=0)
    assert len(plantings) > 1
    assert min(targets_per_distance(plantings, SETTINGS.distances)) >= SETTINGS.min_targets
    assert min(targets_per_distance(plantings[:-1], SETTINGS.distances)) < SETTINGS.min_targets
    assert all(p.ids.numel() == ids.numel() for p in plantings)
    assert len({tuple(p.first_key.tolist()) for p in plantings}) == len(plantings)  # independent plantings


def test_a_validation_split_too_short_for_the_longest_pair_is_refused_in_one_line():
    ids, symbols = tokenized(make_text(2000))
    with pytest.raises(UserError, match="too few for one pair at distance 1536") as err:
        validation_plantings(ids[:1600], ProbeSettings(), symbols, seed=0)
    assert "\n" not in str(err.value)


# --- the symbols -----------------------------------------------------------------------------------
def test_symbols_the_corpus_contains_are_skipped():
    text = "ab ⟪ c Ⓐ Ⓒ \ue000"
    symbols = probe_symbols(text, 60)
    assert symbols.opening not in text and symbols.opening == "\ue001"  # ⟪ is taken: a private-use stand-in
    assert symbols.closing == MARKERS[1]
    assert symbols.keys[:3] == ("Ⓑ", "Ⓓ", "Ⓔ")
    assert symbols.keys[:50] == tuple(c for c in KEY_CHARS if c not in text)  # the 50 visible ones it lacks
    chosen = [symbols.opening, symbols.closing, *symbols.keys]
    assert len(set(chosen)) == 62 and not set(chosen) & set(text)


def test_the_char_vocabulary_holds_the_symbols_and_the_splits_still_decode_to_the_text(tmp_path, tiny_corpus):
    corpus = prepare_corpus(data_cfg(tiny_corpus), OmegaConf.create({"kind": "char"}), tmp_path, SETTINGS, seed=0)
    text = tiny_corpus.read_text(encoding="utf-8")
    train_text, val_text = split_text(text, 0.9)
    symbols = corpus.probe.symbols
    assert corpus.tokenizer.chars == sorted(set(text) | {symbols.opening, symbols.closing, *symbols.keys})
    assert corpus.tokenizer.decode(corpus.train_ids.tolist()) == train_text
    assert corpus.tokenizer.decode(corpus.val_ids.tolist()) == val_text
    assert corpus.probe.train(0).numel() == corpus.train_ids.numel()


# --- the config ------------------------------------------------------------------------------------
def data_cfg(path):
    return OmegaConf.create({"path": str(path), "url": None, "sha256": None, "cache_dir": "unused",
                             "train_fraction": 0.9, "seq_len": 16})


def test_probe_none_changes_nothing(compose_config, tmp_path, tiny_corpus):
    cfg = compose_config(f"data.path={tiny_corpus}")
    assert cfg.probe.name == "none" and ProbeSettings.from_config(cfg.probe) is None
    validate(cfg)
    plain = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok")
    none = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok", ProbeSettings.from_config(cfg.probe), cfg.seed)
    assert none.probe is None and none.tokenizer.chars == plain.tokenizer.chars
    assert torch.equal(none.train_ids, plain.train_ids) and torch.equal(none.val_ids, plain.val_ids)


def test_probe_recall_composes_to_its_settings(compose_config):
    cfg = compose_config("probe=recall")
    validate(cfg)
    assert ProbeSettings.from_config(cfg.probe) == ProbeSettings()  # the yaml and the defaults agree


@pytest.mark.parametrize("override, message", [
    ("probe.keys=1", "invalid probe.keys=1: must be an integer from 2 to 1024"),
    ("probe.distances=[16,0]", "invalid probe.distances=[16, 0]: must be a non-empty list of distinct integers"),
    ("probe.distances=[]", "invalid probe.distances=[]"),
    ("probe.gap=0", "invalid probe.gap=0: must be an integer >= 1"),
    ("probe.min_targets=2.5", "invalid probe.min_targets=2.5"),
    ("tokenizer=spm", NEEDS_CHAR),
])
def test_bad_probe_settings_are_refused_in_one_line(compose_config, override, message):
    with pytest.raises(UserError) as err:
        validate(compose_config("probe=recall", override))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_prepare_corpus_refuses_spm_before_any_work(tmp_path):
    with pytest.raises(UserError, match="probe=recall needs tokenizer=char"):
        prepare_corpus(data_cfg(tmp_path / "missing.txt"), OmegaConf.create({"kind": "spm"}), tmp_path,
                       ProbeSettings())


def test_train_py_refuses_the_probe_with_spm_in_one_line(tmp_path, tiny_corpus):
    before = fingerprint(tmp_path)
    result = run_script(tmp_path, *TINY, f"data.path={tiny_corpus}", "probe=recall", "tokenizer=spm")
    assert result.returncode == 2 and error_line(result.stderr) == f"error: {NEEDS_CHAR}"
    assert_untouched(before, fingerprint(tmp_path))
