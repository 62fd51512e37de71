"""The prepared, memory-mapped token ids (data/token_ids.py): the same ids and batches as the text encoded in
memory, seed for seed; prepared once; a damaged, truncated or foreign file rebuilt; bad input in one line."""

import json
import os
import threading

import pytest
import torch

from gru_experiments.data.batches import CorpusDataModule, RandomWindowBatches, StreamBatches
from gru_experiments.data.corpus import load_corpus, prepare_corpus, read_corpus, split_text
from gru_experiments.data.token_ids import IdsFile, ids_dtype, release_pages
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import UserError

DATA = {"path": None, "url": None, "sha256": None, "cache_dir": None, "train_fraction": 0.9, "seq_len": 32}


def data_of(path, **changes) -> dict:
    return DATA | {"path": str(path)} | changes


def in_memory_ids(path, train_fraction=0.9):
    """Today's encoding before the map: the whole text read, split, encoded into int64 tensors."""
    text = read_corpus(path)
    tokenizer = CharTokenizer.from_text(text)
    return [torch.tensor(tokenizer.encode(part), dtype=torch.long) for part in split_text(text, train_fraction)]


def test_the_smallest_width_that_holds_the_vocabulary():
    assert [ids_dtype(v).name for v in (65, 256, 257, 65536, 65537)] == ["uint8"] * 2 + ["uint16"] * 2 + ["int32"]


def test_mapped_ids_and_their_batches_equal_the_in_memory_ones_seed_for_seed(shakespeare, tmp_path):
    corpus = prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path)
    train, val = in_memory_ids(shakespeare)
    assert corpus.train_ids.dtype == torch.uint8 and torch.equal(corpus.train_ids.long(), train)
    assert corpus.val_ids.dtype == torch.int32 and torch.equal(corpus.val_ids.long(), val)  # int32: half of int64
    for seed in (0, 1234):
        before = RandomWindowBatches(train, 8, 32, 5, torch.Generator().manual_seed(seed))
        after = RandomWindowBatches(corpus.train_ids, 8, 32, 5, torch.Generator().manual_seed(seed))
        for (x0, y0), (x1, y1) in zip(before, after, strict=True):
            assert x1.dtype == torch.long and torch.equal(x0, x1) and torch.equal(y0, y1)
        before, after = (StreamBatches(ids, 8, 32, 5, seed) for ids in (train, corpus.train_ids))
        for (x0, y0, s0), (x1, y1, s1) in zip(before, after, strict=True):
            assert x1.dtype == torch.long and torch.equal(x0, x1) and torch.equal(y0, y1) and s0 == s1


def test_the_data_module_reads_the_same_batches_from_the_map(shakespeare, tmp_path):
    corpus = prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path)
    train, val = in_memory_ids(shakespeare)
    for batching in ("windows", "streams"):
        modules = [CorpusDataModule(t, v, 8, 32, 4, seed=7, batching=batching)
                   for t, v in ((train, val), (corpus.train_ids, corpus.val_ids))]
        for module in modules:
            module.setup("fit")
        for before, after in zip(*(m.train_dataloader() for m in modules), strict=True):
            assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before, after))


@pytest.mark.slow  # ~8 s: trains SentencePiece
def test_spm_ids_are_prepared_once_and_equal_the_in_memory_encoding(shakespeare, tmp_path):
    settings = {"kind": "spm", "vocab_size": 300, "model_type": "unigram", "character_coverage": 1.0}
    first = prepare_corpus(data_of(shakespeare), settings, tmp_path)
    assert first.train_ids.dtype == torch.uint16
    train_text, val_text = split_text(read_corpus(shakespeare), 0.9)
    assert first.train_ids.tolist() == first.tokenizer.encode(train_text)
    assert first.val_ids.tolist() == first.tokenizer.encode(val_text)
    again = prepare_corpus(data_of(shakespeare), settings, tmp_path)
    assert again.tokenizer.model_proto == first.tokenizer.model_proto
    assert torch.equal(again.train_ids, first.train_ids)


def test_a_later_run_maps_the_file_without_reading_the_text(tiny_corpus, tmp_path, monkeypatch):
    prepare_corpus(data_of(tiny_corpus, seq_len=8), {"kind": "char"}, tmp_path)
    monkeypatch.setattr("gru_experiments.data.corpus.read_corpus_text", lambda path: pytest.fail("read the text"))
    monkeypatch.setattr("gru_experiments.data.corpus.text_chunks", lambda corpus: pytest.fail("read the text"))
    corpus = prepare_corpus(data_of(tiny_corpus, seq_len=8), {"kind": "char"}, tmp_path)
    assert corpus.train_ids.numel() > 0


def test_the_text_is_read_in_chunks_and_encoded_alike(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("héllo wörld, ünïcode: 日本語 \r\n" * 500 + "end", encoding="utf-8")
    corpus = prepare_corpus(data_of(path, seq_len=8), {"kind": "char"}, tmp_path / "cache")
    train, val = in_memory_ids(path)
    assert torch.equal(corpus.train_ids.long(), train) and torch.equal(corpus.val_ids, val)


def one_ids_file(folder):
    (record,) = folder.glob("ids-*.json")
    return IdsFile(folder, record.stem.removeprefix("ids-"))


@pytest.mark.parametrize("damage", ["truncated", "past_vocabulary", "another_tokenizer", "no_record"])
def test_a_damaged_ids_file_is_said_and_prepared_again(damage, shakespeare, tmp_path, capsys):
    prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path)
    ids_file = one_ids_file(tmp_path)
    if damage == "truncated":
        ids_file.bin.write_bytes(ids_file.bin.read_bytes()[:1000])
    elif damage == "past_vocabulary":
        data = bytearray(ids_file.bin.read_bytes())
        data[500] = 250
        ids_file.bin.write_bytes(bytes(data))
    elif damage == "another_tokenizer":
        record = json.loads(ids_file.record_file.read_text())
        ids_file.record_file.write_text(json.dumps(record | {"key": "0" * 32}))
    else:
        ids_file.record_file.unlink()
    capsys.readouterr()
    corpus = prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path)
    assert "do not match their record" in capsys.readouterr().out
    train, _ = in_memory_ids(shakespeare)
    assert torch.equal(corpus.train_ids.long(), train)


def test_an_edited_corpus_is_said_and_its_ids_prepared_anew(tiny_corpus, tmp_path, capsys):
    path = tmp_path / "text.txt"
    path.write_text(tiny_corpus.read_text() * 2)
    prepare_corpus(data_of(path, seq_len=8), {"kind": "char"}, tmp_path / "cache")
    path.write_text(tiny_corpus.read_text() * 3)
    corpus = prepare_corpus(data_of(path, seq_len=8), {"kind": "char"}, tmp_path / "cache")
    assert "changed since its token ids were prepared" in capsys.readouterr().out
    assert corpus.train_ids.numel() + corpus.val_ids.numel() == len(read_corpus(path))


def test_two_runs_preparing_at_once_map_one_whole_file(shakespeare, tmp_path):
    results, errors = [], []

    def run():
        try:
            results.append(prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 3
    assert all(torch.equal(r.train_ids, results[0].train_ids) for r in results)
    assert not list(tmp_path.glob(".ids-*"))  # no temporary left behind


def test_no_room_for_the_ids_is_one_line_and_leaves_nothing(shakespeare, tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    with pytest.raises(UserError, match="no room for the corpus's token ids"):
        prepare_corpus(data_of(shakespeare), {"kind": "char"}, tmp_path)
    assert not list(tmp_path.glob("ids-*.bin")) and not list(tmp_path.glob("ids-*.json"))


def test_a_bad_file_is_refused_in_one_line_as_before(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9 ".encode("latin1") * 100)
    with pytest.raises(UserError, match="not UTF-8 text"):
        prepare_corpus(data_of(path, seq_len=8), {"kind": "char"}, tmp_path / "cache")
    path.write_text("ab" * 100, encoding="utf-16")
    with pytest.raises(UserError, match="UTF-16"):
        prepare_corpus(data_of(path, seq_len=8), {"kind": "char"}, tmp_path / "cache")
    assert load_corpus(data_of(path)).sha256  # hashed, not read


def test_the_validation_over_training_scores_the_splits_first_validation_tokens(compose_config, small_shakespeare):
    from gru_experiments.runs.checks import validate
    from gru_experiments.runs.training import prepare

    run = prepare(validate(compose_config(f"data.path={small_shakespeare}", "data.validation_tokens=3000")))
    assert run.data.val_ids.numel() == 3000 and run.epoch_val.n_targets == 2999
    assert run.val.n_targets == run.corpus.val_ids.numel() - 1 > 3000  # the end-of-run evaluation's: the whole
    whole = prepare(validate(compose_config(f"data.path={small_shakespeare}", "data.validation_tokens=null")))
    assert whole.data.val_ids.numel() == whole.corpus.val_ids.numel()
    with pytest.raises(UserError, match="data.validation_tokens"):
        validate(compose_config(f"data.path={small_shakespeare}", "data.validation_tokens=1"))


def mapped_ids(tmp_path, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(random uint8 ids, the same written to an ids file and mapped): n - 1000 training ids, 1000 validation."""
    ids = torch.randint(0, 200, (n,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    ids_file = IdsFile(tmp_path, "k")
    record = ids_file.write([ids.numpy()], {"sha256": "s", "tokenizer": {}, "n_train": n - 1000, "n_val": 1000,
                                            "vocab_size": 256, "dtype": "uint8"})
    return ids, ids_file.load(record).ids


def resident_file_bytes() -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssFile"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_released_pages_leave_the_resident_set_and_read_back_the_same(tmp_path):
    """release_pages gives back a mapped split's pages (the bigram's counting reads a gigabyte's training split
    through the map): the process's file-backed resident memory falls by the view's size, the ids read back the
    same, and a tensor that is no map's is left as it was."""
    n = 48 << 20
    ids, mapped = mapped_ids(tmp_path, n)
    before = resident_file_bytes()
    total = int(mapped.sum(dtype=torch.int64))  # every page read
    grown = resident_file_bytes() - before
    release_pages(mapped[: n // 2])
    assert grown > 0.9 * n and resident_file_bytes() < before + 0.6 * n
    assert int(mapped.sum(dtype=torch.int64)) == total and torch.equal(mapped, ids)
    other = torch.arange(1 << 20)
    release_pages(other)
    assert torch.equal(other, torch.arange(1 << 20))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
@pytest.mark.parametrize("batching", ["windows", "streams"])
def test_batches_from_a_mapped_split_give_its_pages_back(batching, tmp_path):
    """A batch's reads of a mapped training split do not pile up in the resident set (each faults in a large
    stretch of the file on this kernel): after 100 batches of 64 windows over 64 MB, at most a few MB remain."""
    train = mapped_ids(tmp_path, 64 << 20)[1][:(64 << 20) - 1000]
    before = resident_file_bytes()
    if batching == "windows":
        batches = RandomWindowBatches(train, 64, 128, 100, torch.Generator().manual_seed(0))
    else:
        batches = StreamBatches(train, 64, 128, 100, seed=0)
    for batch in batches:
        assert batch[0].shape == (64, 128)
    assert resident_file_bytes() - before < 8 << 20
