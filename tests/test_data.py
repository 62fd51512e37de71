"""Corpus download, split, and batches: shapes, the one-step shift, device, bounds."""

import hashlib
import http.server
import threading
from functools import partial

import pytest
import torch

from gru_experiments.data.batches import IGNORE_INDEX, CorpusDataModule, RandomWindowBatches, eval_windows
from gru_experiments.data.corpus import corpus_path, split_text
from gru_experiments.errors import UserError


def test_random_windows_shift_bounds_and_device():
    ids = torch.arange(1000)  # each id is its own position, so windows are easy to check
    batches = RandomWindowBatches(ids, batch_size=16, seq_len=32, steps=50, generator=torch.Generator().manual_seed(0))
    assert len(batches) == 50
    seen_max = 0
    for inputs, targets in batches:
        assert inputs.shape == targets.shape == (16, 32)
        assert inputs.device == ids.device and inputs.dtype == torch.long
        torch.testing.assert_close(targets, inputs + 1)  # targets are the inputs shifted by one
        torch.testing.assert_close(inputs[:, 1:], inputs[:, :-1] + 1)  # contiguous windows
        seen_max = max(seen_max, int(targets.max()))
    assert seen_max <= 999  # never past the end


def test_random_windows_reach_the_last_target():
    ids = torch.arange(40)
    batches = RandomWindowBatches(ids, batch_size=64, seq_len=32, steps=20, generator=torch.Generator().manual_seed(1))
    assert max(int(t.max()) for _, t in batches) == 39


def test_eval_windows_cover_every_target_once():
    ids = torch.arange(1, 106)  # 105 tokens -> 104 targets, windows of 10 -> 11 windows, last one padded
    inputs, targets = eval_windows(ids, seq_len=10)
    assert inputs.shape == targets.shape == (11, 10)
    scored = targets[targets != IGNORE_INDEX]
    torch.testing.assert_close(scored, ids[1:])
    torch.testing.assert_close(inputs.flatten()[:104], ids[:-1])


def test_split_is_contiguous():
    text = "abcdefghij" * 10
    train, val = split_text(text, 0.9)
    assert train + val == text and len(train) == 90


def test_data_module_puts_data_on_the_device_and_seeds_per_rank():
    dm = CorpusDataModule(torch.arange(500), torch.arange(100), batch_size=4, seq_len=8, steps_per_epoch=3, seed=7)
    dm.setup("fit")
    first = [x for x, _ in dm.train_dataloader()]
    assert all(x.device.type == "cpu" for x in first) and len(first) == 3
    state = dm.state_dict()
    again = CorpusDataModule(torch.arange(500), torch.arange(100), batch_size=4, seq_len=8, steps_per_epoch=3, seed=7)
    again.load_state_dict(state)
    again.setup("fit")
    dm_next = [x for x, _ in dm.train_dataloader()]
    torch.testing.assert_close([x for x, _ in again.train_dataloader()], dm_next)  # resumes the same stream


def test_data_module_rejects_a_corpus_shorter_than_a_window():
    with pytest.raises(UserError, match="fewer than one window"):
        CorpusDataModule(torch.arange(8), torch.arange(8), batch_size=2, seq_len=8, steps_per_epoch=1)


@pytest.fixture
def http_server(tmp_path):
    """A static file server on 127.0.0.1 serving tmp_path/www."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_verifies_and_caches(http_server, tmp_path):
    root, base = http_server
    payload = "First line.\nSecond line.\n".encode()
    (root / "corpus.txt").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    cache = tmp_path / "cache"
    path = corpus_path(None, f"{base}/corpus.txt", digest, cache)
    assert path == cache / "corpus.txt" and path.read_bytes() == payload
    (root / "corpus.txt").unlink()  # a second call must not need the server
    assert corpus_path(None, f"{base}/corpus.txt", digest, cache).read_bytes() == payload


def test_download_with_a_wrong_checksum_leaves_nothing(http_server, tmp_path):
    root, base = http_server
    (root / "corpus.txt").write_text("tampered")
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="checksum mismatch .* train on a local file instead: data.path=FILE"):
        corpus_path(None, f"{base}/corpus.txt", "0" * 64, cache)
    assert list(cache.iterdir()) == []


def test_a_local_path_wins(tiny_corpus):
    assert corpus_path(str(tiny_corpus), "http://unused.invalid/x.txt", None, "unused") == tiny_corpus


def test_the_default_corpus_is_the_shipped_one_read_offline_and_sha_checked(tmp_path, monkeypatch):
    import lzma

    from gru_experiments.data import corpus as data

    assert corpus_path(None, None, None, tmp_path / "cache") == data.SHIPPED_CORPUS
    assert not (tmp_path / "cache").exists()  # nothing downloaded, nothing written
    # A run recorded when the default was a download of the same text reads the shipped copy too.
    assert corpus_path(None, "http://unused.invalid/input.txt", data.SHIPPED_SHA256, tmp_path) == data.SHIPPED_CORPUS
    text = data.read_corpus(data.SHIPPED_CORPUS)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == data.SHIPPED_SHA256
    assert data.SHIPPED_CORPUS.stat().st_size < 500_000
    # A damaged copy is refused in one line.
    monkeypatch.setattr(data, "SHIPPED_SHA256", "0" * 64)
    with pytest.raises(UserError, match="shipped corpus .* is damaged"):
        data.read_corpus(data.SHIPPED_CORPUS)
    # Any local .xz text reads like a plain one.
    packed = tmp_path / "t.txt.xz"
    packed.write_bytes(lzma.compress("héllo\n".encode()))
    assert data.read_corpus(packed) == "héllo\n"
    # One that is no xz (a plain text named .xz, a download cut short) is refused in one line.
    packed.write_bytes(lzma.compress("héllo\n".encode())[:-8])
    with pytest.raises(UserError, match=f"^corpus file is not valid xz: {packed} \\(.+\\)$"):
        data.read_corpus(packed)


def test_data_pystdlib_is_the_shipped_code_corpus_with_its_licence_and_a_char_vocabulary(compose_config, tmp_path):
    import subprocess
    import sys

    from gru_experiments.data import corpus as data
    from gru_experiments.data.corpus import prepare_corpus

    cfg = compose_config("data=pystdlib")
    assert cfg.data.seq_len == 128 and cfg.data.train_fraction == 0.9  # the rest as data=default
    path = corpus_path(cfg.data.path, cfg.data.url, cfg.data.sha256, tmp_path / "cache")
    assert path == data.CORPORA / "pystdlib.txt.xz" and not (tmp_path / "cache").exists()
    assert (data.CORPORA / "pystdlib.LICENSE.txt").read_text().count("PYTHON SOFTWARE FOUNDATION LICENSE") >= 1
    assert path.stat().st_size < 300_000
    corpus = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok")  # read and sha256-checked
    assert corpus.tokenizer.vocab_size == 96  # printable ASCII and the newline: no tab, nothing else
    assert corpus.train_ids.numel() + corpus.val_ids.numel() == 1_154_220
    # The script that rebuilds it checks the shipped copy against the recorded sha256.
    tool = data.CORPORA.parents[2] / "tools" / "build_pystdlib_corpus.py"
    result = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert result.returncode == 0 and "(ok)" in result.stdout


def _data_cfg(path, seq_len=16):
    from omegaconf import OmegaConf

    return OmegaConf.create({"path": path and str(path), "url": None, "sha256": None, "cache_dir": "unused",
                             "train_fraction": 0.9, "seq_len": seq_len})


def test_char_vocabulary_is_the_whole_corpus_and_spm_learns_from_the_training_split(tmp_path):
    from omegaconf import OmegaConf

    from gru_experiments.data.corpus import prepare_corpus

    path = tmp_path / "new_chars.txt"
    text = "abc abc\n" * 400 + "é½\txyz€ abc\n" * 20  # the last tenth has characters the rest lacks
    path.write_text(text, encoding="utf-8")
    train_text, val_text = split_text(text, 0.9)
    assert set(val_text) - set(train_text) == set("é½\txyz€")
    corpus = prepare_corpus(_data_cfg(path), OmegaConf.create({"kind": "char"}), tmp_path / "tok")
    assert corpus.tokenizer.chars == sorted(set(text))
    assert corpus.tokenizer.decode(corpus.val_ids.tolist()) == val_text
    assert corpus.tokenizer.decode(corpus.train_ids.tolist()) == train_text
    # SentencePiece still sees the training split only: the new characters are not among its pieces.
    spm = prepare_corpus(_data_cfg(path), OmegaConf.create({"kind": "spm", "vocab_size": 7}), tmp_path / "tok")
    assert set(spm.tokenizer.unknown_characters(val_text)) == set("é½\txyz€")


def test_tiny_shakespeare_char_vocabulary_is_its_65_characters(tmp_path):
    from omegaconf import OmegaConf

    from gru_experiments.data.corpus import prepare_corpus

    corpus = prepare_corpus(_data_cfg(None, 256), OmegaConf.create({"kind": "char"}), tmp_path)
    assert corpus.tokenizer.vocab_size == 65


def test_a_window_sampler_state_from_another_device_type_reseeds_and_says_so(capsys):
    """A GPU run resumed on a CPU: a CUDA generator's state does not load into a CPU generator, so the
    sampler is reseeded from that state (the same on every such resume) and the run says so in a line."""
    def resumed(state):
        data = CorpusDataModule(torch.arange(2000) % 11, torch.arange(300) % 11, 4, 8, 5, seed=3)
        data.setup("fit")
        data.load_state_dict({"generator_state": state})
        return data.generator.get_state()

    foreign = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's state is 16 bytes
    first = resumed(foreign)
    assert "ran on another device type than cpu" in capsys.readouterr().out
    assert torch.equal(first, resumed(foreign)) and not torch.equal(first, resumed(foreign + 1))
    capsys.readouterr()
    own = torch.Generator().manual_seed(99).get_state()
    assert torch.equal(resumed(own), own) and "another device" not in capsys.readouterr().out


def test_a_new_shipped_corpus_is_its_file_and_one_yaml(tmp_path, monkeypatch):
    """A corpus joins as its `.txt.xz` beside the shipped ones and a conf/data YAML naming its sha256: no list in
    data/corpus.py to edit; the report names it after its file."""
    import lzma
    import shutil

    from conftest import CONF
    from hydra import compose, initialize_config_dir

    from gru_experiments.data import corpus as data

    corpora = tmp_path / "corpora"
    shutil.copytree(data.CORPORA, corpora)
    text = "def f(x):\n    return x\n" * 200
    (corpora / "mytext.txt.xz").write_bytes(lzma.compress(text.encode()))
    sha256 = hashlib.sha256(text.encode()).hexdigest()
    monkeypatch.setattr(data, "CORPORA", corpora)
    data.shipped_corpora.cache_clear()  # and again at the end: the next test reads the real folder
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "data" / "mytext.yaml").write_text(f"defaults:\n  - default\n  - _self_\n\nsha256: {sha256}\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["data=mytext", f"paths.data_dir={tmp_path / 'cache'}"])
    try:
        loaded = data.load_corpus(cfg.data)
        assert (loaded.text, loaded.sha256, loaded.source) == (text, sha256, corpora / "mytext.txt.xz")
        assert data.corpus_name(None, None, sha256) == "mytext"
    finally:
        data.shipped_corpora.cache_clear()


@pytest.mark.parametrize("kind, write", [("gzip", lambda data: __import__("gzip").compress(data)),
                                         ("bzip2", lambda data: __import__("bz2").compress(data))])
def test_a_compressed_corpus_is_named_so_with_the_command_that_decompresses_it(tmp_path, kind, write):
    """Issue 72: data.path=x.gz was advised to convert it with iconv."""
    from gru_experiments.data.corpus import read_corpus_text
    from gru_experiments.errors import UserError

    path = tmp_path / "x.gz"
    path.write_bytes(write(b"ROMEO: hello\n" * 50))
    with pytest.raises(UserError, match=rf"^corpus file is not UTF-8 text: {path} \(it is a {kind}-compressed file, "
                                        r"not text; decompress it first, e.g. \w+ (-k )?FILE \(a corpus, data.path, "
                                        r"may be .xz as it is\)\)$"):
        read_corpus_text(path)
