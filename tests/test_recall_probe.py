"""The planted-recall probe (probe=recall, data/recall_probe.py): pairs where the record says, the text
untouched around them, balanced distances, a fresh planting every training pass, enough validation
targets, the symbols the corpus lacks, the batches reading each pass's ids, and the config's checks."""

from __future__ import annotations

import itertools
import signal
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import make_text
from omegaconf import OmegaConf
from robustness_helpers import (
    TINY,
    assert_untouched,
    error_line,
    fingerprint,
    run_killed_after_checkpoint,
    run_script,
)

from gru_experiments.data.batches import CorpusDataModule, RandomWindowBatches, StreamBatches
from gru_experiments.data.corpus import prepare_corpus, split_text
from gru_experiments.data.recall_probe import (
    KEY_CHARS,
    MARKERS,
    MAX_VALIDATION_PLANTINGS,
    NEEDS_CHAR,
    Pairs,
    Phase,
    PlantedSplit,
    ProbeSettings,
    SymbolIds,
    ValidationPairs,
    describe_validation,
    fitting_pairs,
    plant,
    planting_generator,
    probe_symbols,
    targets_per_distance,
    validation_plantings,
)
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import UserError
from gru_experiments.runs.checks import validate


def single_phase(distances, gap: int, min_targets: int = 200, keys: int = 16) -> ProbeSettings:
    """One phase for the whole run, validated at the same distances and gap (the probe before the phases)."""
    return ProbeSettings(keys, (Phase(distances, gap),), ValidationPairs(distances, gap, min_targets))


SETTINGS = single_phase((3, 10, 40), gap=8, min_targets=30, keys=5)
PAIRS = SETTINGS.validation  # distances 3, 10, 40, gap 8, 30 targets each
OLD_DEFAULT = Pairs((16, 48, 96, 192, 384, 768, 1536), 64)  # the probe's first (sparse) schedule


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
@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairs_are_where_the_record_says_and_the_text_around_them_is_untouched(seed, cut):
    ids, symbols = tokenized(make_text(6000, seed))
    planting = plant(ids, PAIRS, symbols, planting_generator(seed, "train", 0), cut=cut)
    planted = planting.ids.tolist()
    # Inserted: the split and 4 tokens a pair; cut (the validation plantings): the plain split's length.
    assert len(planted) == ids.numel() + (0 if cut else 4 * planting.recall.numel())
    pairs = scan_pairs(planted, symbols.opening, symbols.closing)
    assert len(pairs) == planting.recall.numel() > 50
    assert [p[0] for p in pairs] == planting.first_key.tolist()
    assert [p[1] for p in pairs] == planting.recall.tolist()
    assert [p[2] for p in pairs] == planting.distances.tolist()
    assert [p[3] for p in pairs] == planting.keys.tolist()
    assert set(planting.distances.tolist()) <= set(PAIRS.distances)
    assert set(planting.keys.tolist()) <= set(symbols.keys.tolist())
    # Probe symbols appear only in the pairs (4 a pair) ...
    probe_ids = {symbols.opening, symbols.closing, *symbols.keys.tolist()}
    assert sum(t in probe_ids for t in planted) == 4 * len(pairs)
    # ... and without them the planted split is the plain text: all of it, or cut.
    dropped = {q for first, recall, _, _ in pairs for q in (first - 1, first, recall - 1, recall)}
    text = [t for q, t in enumerate(planted) if q not in dropped]
    assert text == (ids[: len(text)].tolist() if cut else ids.tolist())
    # The pairs fill the text: after the last pair, less than one more pair's text (or its cut length).
    after = len(planted) - 1 - pairs[-1][1]
    assert after < 2 * PAIRS.gap + max(PAIRS.distances) + (4 if cut else 0)
    # Sparse and never overlapping: [gap, 2 gap] plain tokens before every pair.
    ends = [-1] + [recall for _, recall, _, _ in pairs]
    gaps = [first - 1 - (end + 1) for (first, _, _, _), end in zip(pairs, ends)]
    assert all(PAIRS.gap <= g <= 2 * PAIRS.gap for g in gaps), gaps


def test_distances_are_balanced_and_keys_spread():
    settings = OLD_DEFAULT
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
        planting = plant(ids, OLD_DEFAULT, symbols, planting_generator(0, "train", p))
        took.append(time.perf_counter() - start)
    assert planting.ids.numel() == ids.numel() + 4 * planting.recall.numel() and min(took) < 0.5, took


# --- the training split: a fresh planting every pass ---------------------------------------------
def test_the_training_split_is_planted_afresh_every_pass_and_the_same_for_the_same_seed():
    ids, symbols = tokenized(make_text(20_000))
    split = PlantedSplit(ids, SETTINGS.phases, symbols, seed=3)
    first, second = split.planting(0), split.planting(1)
    assert not torch.equal(first.ids, second.ids)
    assert first.first_key.tolist() != second.first_key.tolist()[: first.first_key.numel()]
    assert first.keys.tolist() != second.keys.tolist()[: first.keys.numel()]
    again = PlantedSplit(ids, SETTINGS.phases, symbols, seed=3)
    assert torch.equal(again(1), second.ids) and torch.equal(again(0), first.ids)
    assert not torch.equal(PlantedSplit(ids, SETTINGS.phases, symbols, seed=4)(0), first.ids)
    # Planting p of a split: the validation split's planting 0 is another draw than the training split's.
    assert planting_generator(3, "train", 0).initial_seed() != planting_generator(3, "validation", 0).initial_seed()


# --- no training text lost: the pairs are inserted, never written over it ------------------------------
def without_probe_tokens(ids: torch.Tensor, symbols: SymbolIds) -> torch.Tensor:
    return ids[~torch.isin(ids, torch.cat([torch.tensor([symbols.opening, symbols.closing]), symbols.keys]))]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_planting_drops_no_training_text_in_any_phase(compose_config, seed):
    """Every pass of the planted training split, in every phase (the default schedule's, a test
    schedule's, the sparse one's), is the whole plain split in order once the probe's tokens are
    taken out; it is longer than the split by the pairs' 4 tokens each."""
    ids, symbols = tokenized(make_text(30_000, seed), keys=16)
    default = ProbeSettings.from_config(compose_config("probe=recall").probe).phases
    for phases in (default, PHASES, (Phase(OLD_DEFAULT.distances, OLD_DEFAULT.gap),)):
        split = PlantedSplit(ids, phases, symbols, seed=seed)
        split.steps = 100
        for index, phase in enumerate(phases):
            step = round(phase.start * split.steps)
            assert split.phase_at(step) == index
            for pass_index in (0, 1):
                planting = split.planting(pass_index, step)
                assert set(planting.distances.tolist()) <= set(phase.distances) and planting.recall.numel() > 5
                assert torch.equal(without_probe_tokens(planting.ids, symbols), ids)
                assert planting.ids.numel() == ids.numel() + 4 * planting.recall.numel()


def test_the_readers_read_a_planted_pass_longer_than_the_split_whole():
    ids = torch.arange(1000)
    longer = lambda p, step: torch.arange(1500) + 10_000 * p  # noqa: E731 - a planted pass: 1.5 x the split
    # Streams: a pass is laid out over its own ids, so it takes more chunks than the split's.
    streams = StreamBatches(ids, 4, 10, steps=1, seed=0, pass_ids=longer)
    assert streams.chunks_per_pass == 24 and streams.chunks_of(1500) == 37
    streams.steps = 37
    batches = list(streams)
    assert (streams.pass_index, streams.chunk, streams.step) == (1, 0, 37)
    assert [b[2] for b in batches] == [True] + [False] * 36
    read = torch.cat([b[0] for b in batches], dim=1).reshape(-1)
    offset = streams.offset(0)
    assert torch.equal(read, torch.arange(offset, offset + 1480))  # every token once, but the cut tail
    # Windows: an epoch of the recipe's steps, its windows drawn from anywhere in the longer pass.
    windows = RandomWindowBatches(ids, 64, 8, steps=20, generator=torch.Generator().manual_seed(0), pass_ids=longer)
    inputs = torch.cat([x for x, _ in windows])
    assert len(windows) == 20 and int(inputs.max()) > 1200 and int(inputs.max()) < 1500


def test_a_stream_pass_whose_ids_shrink_under_it_ends_there():
    """A phase switch mid-pass gives the pass a shorter planting: read on while its chunks last, then a
    new pass, from the initial state; every step asked for once, in order."""
    ids, asked = torch.arange(1000), []

    def source(p, step):
        asked.append(step)
        return torch.arange(1500 if step < 30 else 1000) + 10_000 * p

    streams = StreamBatches(ids, 4, 10, steps=40, seed=0, pass_ids=source)
    batches = list(streams)
    assert [i for i, b in enumerate(batches) if b[2]] == [0, 30]  # chunk 30 is past the shorter pass's 24
    assert int(batches[30][0].min()) // 10_000 == 1 and sorted(set(asked)) == list(range(40))
    state = streams.state_dict()
    assert state == {"pass_index": 1, "chunk": 10, "step": 40}
    restored = StreamBatches(ids, 4, 10, steps=5, seed=0, pass_ids=source)
    restored.load_state_dict(state)
    assert torch.equal(next(iter(restored))[0], next(iter(streams))[0])


def test_window_batches_read_each_epochs_planting_and_resume_in_the_same_epoch():
    ids = torch.arange(400)
    source = lambda p, step: ids + 1000 * p  # noqa: E731 - pass p's ids say which pass they are
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
    reader = StreamBatches(ids, 4, 10, steps=10_000, seed=0, pass_ids=lambda p, step: ids + 10_000 * p)
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
        planted = probe.train(0)
        assert set(inputs.tolist()) <= set(planted.tolist())
        assert torch.isin(inputs, probe.symbol_ids.keys).any()  # the windows see planted keys
        assert torch.equal(torch.cat([x.flatten() for x, _ in data.val_dataloader()])[: corpus.val_ids.numel() - 1],
                           corpus.val_ids[:-1])


# --- the validation split --------------------------------------------------------------------------
def test_validation_plantings_give_every_distance_its_targets_with_as_few_plantings_as_will_do():
    ids, symbols = tokenized(make_text(3000))
    plantings = validation_plantings(ids, PAIRS, symbols, seed=0)
    assert len(plantings) > 1
    assert min(targets_per_distance(plantings, PAIRS.distances)) >= PAIRS.min_targets
    assert min(targets_per_distance(plantings[:-1], PAIRS.distances)) < PAIRS.min_targets
    assert all(p.ids.numel() == ids.numel() for p in plantings)
    assert len({tuple(p.first_key.tolist()) for p in plantings}) == len(plantings)  # independent plantings


def test_validation_distances_a_short_split_cannot_hold_are_left_out_and_said():
    pairs = ValidationPairs((8, 64, 1536), gap=64, min_targets=5)
    kept, left_out = fitting_pairs(pairs, 1600)
    assert kept.distances == (8, 64) and left_out == [1536]  # 2 x 64 + 1536 + 4 > 1600
    ids, symbols = tokenized(make_text(2000))
    plantings = validation_plantings(ids[:1600], kept, symbols, seed=0)
    assert describe_validation(kept, plantings, left_out) == [
        "probe=recall: validation distances 1536 left out: a pair does not fit the validation split (1,600 tokens)"]
    with pytest.raises(UserError, match="too few for one pair at distance 8") as err:
        fitting_pairs(pairs, 100)
    assert "\n" not in str(err.value)


def test_targets_the_split_cannot_give_within_the_plantings_bound_are_said_not_waited_for():
    ids, symbols = tokenized(make_text(2000))
    pairs = ValidationPairs((8, 64), gap=16, min_targets=100_000)
    plantings = validation_plantings(ids, pairs, symbols, seed=0)
    assert len(plantings) == MAX_VALIDATION_PLANTINGS
    [line] = describe_validation(pairs, plantings, [])
    assert line.startswith(f"probe=recall: {MAX_VALIDATION_PLANTINGS} plantings of the validation split (the most "
                           "it takes) give fewer than probe.validation.min_targets=100000 recall targets at d = 8 (")


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
    planted = corpus.probe.train(0)  # the training split with the pairs inserted: 4 tokens a pair
    assert planted.numel() == corpus.train_ids.numel() + 4 * corpus.probe.train.planting(0).recall.numel()
    assert corpus.tokenizer.extra == (symbols.opening, symbols.closing, *symbols.keys)


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
    settings = ProbeSettings.from_config(cfg.probe)
    assert settings.keys == 16 and [p.start for p in settings.phases] == [0.0, 0.2]
    assert settings.phases[0] == Phase((4, 8), 2) and max(settings.phases[1].distances) <= 128  # inside the window
    assert settings.validation.distances[0] == 8 and max(settings.validation.distances) >= 4096
    assert settings.validation.min_targets >= 200


def test_the_earlier_schedules_are_variants_validated_like_the_default(compose_config):
    default = ProbeSettings.from_config(compose_config("probe=recall").probe)
    sparse = ProbeSettings.from_config(compose_config("probe=recall_sparse").probe)
    dense = ProbeSettings.from_config(compose_config("probe=recall_dense").probe)
    assert sparse.phases == (Phase(OLD_DEFAULT.distances, OLD_DEFAULT.gap),)
    assert dense.phases == (Phase((4, 8, 16, 32, 64, 128, 256), 8),)  # as recall_dense planted its training split
    for variant in (sparse, dense):
        assert variant.validation == default.validation and variant.keys == default.keys


@pytest.mark.parametrize("override, message", [
    ("probe.keys=1", "invalid probe.keys=1: must be an integer from 2 to 1024"),
    ("probe.validation.distances=[16,0]",
     "invalid probe.validation.distances=[16, 0]: must be a non-empty list of distinct integers"),
    ("probe.validation.distances=[]", "invalid probe.validation.distances=[]"),
    ("probe.validation.gap=0", "invalid probe.validation.gap=0: must be an integer >= 1"),
    ("probe.validation.min_targets=2.5", "invalid probe.validation.min_targets=2.5"),
    ("probe.validation.min_targets=1000000000", "invalid probe.validation.min_targets=1000000000: must be an integer"),
    ("+probe.validation.stride=3", "unknown key probe.validation.stride: probe.validation takes distances, gap"),
    ("probe.phases.1.gap=0", "invalid probe.phases[1].gap=0: must be an integer >= 1"),
    ("probe.phases.1.start=1.5", "invalid probe.phases[1].start=1.5: must be a number in [0, 1)"),
    ("probe.phases.0.start=0.5", "invalid probe.phases starts [0.5, 0.2]: the first must be 0"),
    ("probe.phases=[]", "invalid probe.phases=[]: must be a non-empty list"),
    ("+probe.distances=[4]", "unknown key probe.distances: probe=recall takes keys, phases, validation"),
    ("tokenizer=spm", NEEDS_CHAR),
    ("training.recall_weight=0.5", "invalid training.recall_weight=0.5: must be a number >= 1"),
])
def test_bad_probe_settings_are_refused_in_one_line(compose_config, override, message):
    with pytest.raises(UserError) as err:
        validate(compose_config("probe=recall", override))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_prepare_corpus_refuses_spm_before_any_work(tmp_path):
    with pytest.raises(UserError, match="probe=recall needs tokenizer=char"):
        prepare_corpus(data_cfg(tmp_path / "missing.txt"), OmegaConf.create({"kind": "spm"}), tmp_path,
                       SETTINGS)


@pytest.mark.slow
def test_train_py_refuses_the_probe_with_spm_in_one_line(tmp_path, tiny_corpus):
    before = fingerprint(tmp_path)
    result = run_script(tmp_path, *TINY, f"data.path={tiny_corpus}", "probe=recall", "tokenizer=spm")
    assert result.returncode == 2 and error_line(result.stderr) == f"error: {NEEDS_CHAR}"
    assert_untouched(before, fingerprint(tmp_path))


# --- the training schedule: phases -------------------------------------------------------------------
PHASES = (Phase((3,), 4, 0.0), Phase((40,), 8, 0.5))  # d = 3 for the first half of the run, 40 after


def test_a_phase_switches_at_its_step_and_plants_afresh_there():
    ids, symbols = tokenized(make_text(20_000))
    split = PlantedSplit(ids, PHASES, symbols, seed=3)
    split.steps = 10  # the run's steps: phase 1 from step round(0.5 x 10) = 5
    assert [split.phase_at(s) for s in range(10)] == [0] * 5 + [1] * 5
    before, after = split.planting(0, 4), split.planting(0, 5)
    assert set(before.distances.tolist()) == {3} and set(after.distances.tolist()) == {40}
    assert split.planting(0, 9) is after and split.planting(1, 9) is not after  # a new pass: a new planting
    # Phase 0 plants exactly what the probe before phases planted (its runs resume to their figures).
    assert torch.equal(before.ids, plant(ids, PHASES[0], symbols, planting_generator(3, "train", 0)).ids)


@pytest.mark.parametrize("batching", ["windows", "streams"])
def test_the_readers_ask_for_each_batchs_own_step_also_after_a_mid_pass_resume(batching):
    """The step a reader hands its source is the optimiser step of the batch: the phase switch lands on
    its step, and a reader restored from its state asks for what the uninterrupted one asked for."""
    ids = torch.arange(2000)

    def reader(asked):
        source = lambda p, step: asked.append((p, step)) or ids  # noqa: E731
        if batching == "windows":
            return RandomWindowBatches(ids, 2, 8, steps=4, generator=torch.Generator().manual_seed(0),
                                       pass_ids=source)
        return StreamBatches(ids, 2, 8, steps=4, seed=0, pass_ids=source)

    asked = []
    uninterrupted = reader(asked)
    for _ in range(3):  # three epochs of 4 steps
        list(uninterrupted)
    assert [step for _, step in asked] == list(range(12))
    if batching == "windows":
        assert [p for p, _ in asked] == [0] * 4 + [1] * 4 + [2] * 4
    else:  # a pass of the streams holds (2000 - 8) // (2 x 8) = 124 chunks
        assert {p for p, _ in asked} == {0}
    resumed_asked, first = [], reader([])
    list(first)
    iterator = iter(first)
    next(iterator)  # step 4, then the run is killed
    resumed = reader(resumed_asked)
    resumed.load_state_dict(first.state_dict())
    taken = list(itertools.islice(resumed, 3))  # Lightning ends the resumed epoch after 3 batches
    assert len(taken) == 3 and resumed_asked == asked[5:8]


def test_the_data_module_sets_the_runs_steps_on_the_probe(tmp_path, tiny_corpus):
    phased = ProbeSettings(5, PHASES, PAIRS)
    corpus = prepare_corpus(data_cfg(tiny_corpus), OmegaConf.create({"kind": "char"}), tmp_path, phased, seed=1)
    data = CorpusDataModule(corpus.train_ids, corpus.val_ids, 4, 16, 5, seed=1, probe=corpus.probe)

    class Trainer:  # what the data module reads of Lightning's
        max_epochs, max_steps, global_rank, world_size = 3, -1, 0, 1
        strategy = type("Strategy", (), {"root_device": torch.device("cpu")})()

    data.trainer = Trainer()
    data.setup("fit")
    split = corpus.probe.train
    assert split.steps == 15 and split.phase_at(7) == 0 and split.phase_at(8) == 1
    Trainer.max_steps = 6  # max_steps ends training first
    data.setup("fit")
    assert corpus.probe.train.steps == 6 and corpus.probe.train.phase_at(3) == 1


@pytest.mark.parametrize("mode", ["windows", "streams"])
@pytest.mark.slow
def test_a_probe_run_killed_in_its_second_phase_resumes_to_every_figure(tmp_path, tiny_corpus, mode):
    """Killed at step 6 of 8 (phase 1 from step 4, mid-epoch), resumed: the resumed run plants what the
    uninterrupted one planted, so its summary, the recall figures included, is the uninterrupted one's."""
    from test_resume import figure_differences, summary_in_run_terms

    base = [*TINY, f"data.path={tiny_corpus}", f"training={mode}", "data.seq_len=16", "model.steps_per_epoch=4",
            "model.epochs=2", "checkpoint.every_n_steps=2", "evaluation.text.samples=0", "probe=recall",
            "probe.phases=[{start: 0.0, distances: [4], gap: 2}, {start: 0.5, distances: [4, 12], gap: 4}]",
            "probe.validation.distances=[4,12,40]", "probe.validation.min_targets=10"]
    assert run_script(tmp_path / "reference", *base).returncode == 0
    (uninterrupted,) = (tmp_path / "reference" / "outputs" / "runs" / "astra_alpha").iterdir()
    root = tmp_path / "root"
    killed = run_killed_after_checkpoint(root, 6, *base)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (run,) = (root / "outputs" / "runs" / "astra_alpha").iterdir()
    if mode == "windows":  # a resume that would change the probe is refused in a line naming the key, run untouched
        before = fingerprint(run)
        for override, key in (("probe.keys=8", "probe.keys=16, but this command asks for probe.keys=8"),
                              ("probe.phases=[{start:0,distances:[4],gap:2}]", "probe.phases=[{'start': 0.0")):
            refused = run_script(root, f"resume={run}", "probe=recall", override)
            assert refused.returncode == 2 and key in error_line(refused.stderr), refused.stderr[-2000:]
        # without probe=recall, the command's own config has no probe.keys: Hydra refuses it, naming the key
        refused = run_script(root, f"resume={run}", "probe.keys=8")
        assert refused.returncode == 1 and "Could not override 'probe.keys'" in refused.stderr
        assert_untouched(before, fingerprint(run))
    resumed = run_script(root, f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr
    summary = summary_in_run_terms(run)
    assert summary["resumed_from_step"] == 6 and summary["recall"]["distances"] == [4, 12, 40]
    assert figure_differences(summary, summary_in_run_terms(uninterrupted)) == []


# --- the recall targets' weight in the training loss (training.recall_weight) ---------------------
def test_the_recall_weight_weighs_the_targets_after_the_closing_marker_and_1_is_plain_cross_entropy():
    from gru_experiments.runs.task import LanguageModelTask

    torch.manual_seed(0)
    task = LanguageModelTask({"_target_": "gru_experiments.models.recurrent.RecurrentLM", "cell": "gru",
                              "embedding_dim": 8, "hidden_size": 8}, 7).eval()  # no dropout: one loss per input
    task.log = lambda *args, **kwargs: None
    task.optimizers = lambda: type("O", (), {"param_groups": [{"lr": 0.0}]})()
    cue = 6
    inputs = torch.tensor([[1, 6, 2, 3, 6, 4], [6, 0, 1, 2, 3, 4]])
    targets = torch.tensor([[6, 2, 3, 6, 4, 5], [0, 1, 2, 3, 4, 5]])
    with torch.no_grad():
        logits, _ = task.model(inputs)
    losses = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), reduction="none")
    recalled = (inputs.reshape(-1) == cue)
    assert recalled.sum() == 3
    with torch.no_grad():
        assert torch.allclose(task.training_step((inputs, targets), 0), losses.mean())
        task.weigh_recall(cue, 1)
        assert torch.allclose(task.training_step((inputs, targets), 0), losses.mean())
        task.weigh_recall(cue, 5)
        expected = (losses.sum() + 4 * losses[recalled].sum()) / (recalled.numel() + 4 * 3)
        assert torch.allclose(task.training_step((inputs, targets), 0), expected)


def test_a_probe_run_weighs_its_recall_targets_as_training_recall_weight_says(compose_config, tiny_corpus):
    from gru_experiments.runs.training import prepare

    cfg = compose_config("probe=recall", f"data.path={tiny_corpus}", "training.recall_weight=12",
                         "probe.validation.distances=[4]", "probe.validation.min_targets=1")
    task = prepare(validate(cfg)).task
    closing = task.tokenizer.encode(MARKERS[1])[0]
    assert (task.recall_cue, task.recall_weight) == (closing, 12.0)
    without_probe = validate(compose_config(f"data.path={tiny_corpus}", "training.recall_weight=12"))
    assert prepare(without_probe).task.recall_weight == 1
