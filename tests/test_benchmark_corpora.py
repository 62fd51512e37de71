"""The benchmark corpora one command away (data=enwik8, data=text8), tried offline: a small zip built here and named
by a file:// URL in their place. Downloaded once and unzipped; split train/validation/test as the literature splits
them (scaled down); tokenizer=byte; the test split scored only under evaluation.split=test; bad input in one line."""

import hashlib
import zipfile

import pytest
import torch
from robustness_helpers import TINY

from gru_experiments.data.corpus import corpus_path, prepare_corpus, scored_split, split_sizes
from gru_experiments.data.token_ids import ids_key
from gru_experiments.data.tokenizers import ByteTokenizer, tokenizer_from_json, tokenizer_to_json
from gru_experiments.errors import UserError
from gru_experiments.runs.checks import validate
from gru_experiments.runs.training import prepare

# XML with non-ASCII text and one invalid UTF-8 sequence (a lone continuation byte), as a Wikipedia dump may hold
PAYLOAD = b"".join(f"<page><title>Caf\u00e9 {i}</title><text>na\u00efve \u2013 {i * i}</text></page>\n".encode()
                   for i in range(120)) + b"<text>\x80 cut</text>\n"


@pytest.fixture
def enwik_zip(tmp_path):
    """(file:// URL of a zip holding one file `enwik8`, the zip's sha256)."""
    archive = tmp_path / "server" / "enwik8.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("enwik8", PAYLOAD)
    return archive.as_uri(), hashlib.sha256(archive.read_bytes()).hexdigest()


def enwik_data(url: str, sha256: str, cache, **changes) -> dict:
    return {"path": None, "url": url, "sha256": sha256, "cache_dir": str(cache), "train_fraction": 0.9,
            "test_fraction": 0.05, "seq_len": 32} | changes


def test_the_zip_is_downloaded_once_and_unzipped_once(enwik_zip, tmp_path, capsys):
    url, sha256 = enwik_zip
    cache = tmp_path / "cache"
    path = corpus_path(None, url, sha256, cache)
    assert path == cache / "enwik8" and path.read_bytes() == PAYLOAD
    said = capsys.readouterr().out
    assert "downloading" in said and "unzipping" in said
    (tmp_path / "server" / "enwik8.zip").unlink()  # no "network" from here on
    (cache / "enwik8.zip").unlink()  # and no zip: the unzipped file is what later runs take
    assert corpus_path(None, url, sha256, cache).read_bytes() == PAYLOAD
    assert capsys.readouterr().out == ""


def test_a_zip_that_fails_its_sha256_is_refused_in_one_line_and_nothing_kept(enwik_zip, tmp_path):
    url, _ = enwik_zip
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=r"^could not download the corpus from .*checksum mismatch.*data.path=FILE$"):
        corpus_path(None, url, "0" * 64, cache)
    assert list(cache.iterdir()) == []


def test_a_damaged_zip_is_refused_in_one_line(tmp_path):
    served = tmp_path / "server" / "text8.zip"
    served.parent.mkdir()
    served.write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(UserError, match=r"text8.zip is not a readable zip .*: delete it to download it again"):
        corpus_path(None, served.as_uri(), None, tmp_path / "cache")
    assert not (tmp_path / "cache" / "text8").exists()


def test_the_split_is_the_literatures_90_5_5_and_the_default_split_unchanged():
    assert split_sizes(100_000_000, {"train_fraction": 0.9, "test_fraction": 0.05}) == (90_000_000, 5_000_000,
                                                                                         5_000_000)
    assert split_sizes(1_115_394, {"train_fraction": 0.9}) == (1_003_854, 111_540, 0)  # Tiny Shakespeare's, as ever
    # no test split: the ids keep the key they had, so that a corpus prepared before is not prepared again
    settings = {"kind": "char"}
    assert ids_key("a" * 64, settings, 0.9) == ids_key("a" * 64, settings, 0.9, 0) != ids_key("a" * 64, settings,
                                                                                               0.9, 0.05)


def test_the_byte_tokenizer_is_the_utf8_bytes():
    tokenizer = ByteTokenizer()
    assert tokenizer.vocab_size == 256 and tokenizer.token_char_lengths.tolist() == [1] * 256
    assert tokenizer.encode("Caf\u00e9") == [67, 97, 102, 0xC3, 0xA9]
    assert tokenizer.decode(torch.tensor([67, 97, 102, 0xC3, 0xA9])) == "Caf\u00e9"
    assert tokenizer.decode([0x80]) == "\ufffd"  # a byte that starts no character: one replacement character
    assert tokenizer_from_json(tokenizer_to_json(tokenizer)).state_dict() == {"kind": "byte"}


def test_enwik8_under_the_byte_tokenizer_is_its_bytes_split_90_5_5(enwik_zip, tmp_path):
    url, sha256 = enwik_zip
    corpus = prepare_corpus(enwik_data(url, sha256, tmp_path / "cache"), {"kind": "byte"}, tmp_path / "tokenizers")
    n = len(PAYLOAD)
    n_train, n_test = int(n * 0.9), int(n * 0.05)
    assert isinstance(corpus.tokenizer, ByteTokenizer) and corpus.train_ids.dtype == torch.uint8
    assert bytes(corpus.train_ids.tolist()) == PAYLOAD[:n_train]
    assert bytes(corpus.val_ids.tolist()) == PAYLOAD[n_train:n - n_test]
    assert bytes(corpus.test_ids.tolist()) == PAYLOAD[n - n_test:]  # the invalid byte included, as it is
    assert corpus.scored_split("validation") is corpus.val_ids and corpus.scored_split("test") is corpus.test_ids


def test_enwik8_with_an_invalid_sequence_under_the_char_tokenizer_is_refused_in_one_line(enwik_zip, tmp_path):
    url, sha256 = enwik_zip
    with pytest.raises(UserError, match=r"^corpus file is not UTF-8 text: .*enwik8 \(byte 0x80 at offset 7790, line "
                                        r"121; .*\), or train on its bytes as they are: tokenizer=byte$"):
        prepare_corpus(enwik_data(url, sha256, tmp_path / "cache"), {"kind": "char"}, tmp_path / "tokenizers")
    assert not list((tmp_path / "tokenizers").glob("ids-*.bin"))  # no ids kept


def test_evaluation_split_test_scores_the_test_split_and_only_at_the_end(compose_config, enwik_zip, tmp_path):
    url, sha256 = enwik_zip
    run = prepare(validate(compose_config(*TINY, "data=enwik8", f"data.url={url}", f"data.sha256={sha256}",
                                          f"data.cache_dir={tmp_path / 'cache'}", "tokenizer=byte",
                                          "evaluation.split=test")))
    assert torch.equal(run.val.ids, run.corpus.test_ids)  # the end-of-run evaluation's
    assert torch.equal(run.epoch_val.ids, run.corpus.val_ids[:run.epoch_val.ids.numel()])  # every validation's
    assert run.corpus.tokenizer.kind == "byte" and run.task.model.vocab_size == 256


def test_evaluation_split_test_without_a_test_split_is_refused_in_one_line(compose_config, tiny_corpus, tmp_path):
    """By train.py before any work (no ids prepared), and by sample.py's and the API's door (scored_split)."""
    with pytest.raises(UserError, match=r"^evaluation.split=test: the corpus tiny has no test split "
                                        r"\(data.test_fraction is 0\); give data.test_fraction"):
        validate(compose_config(*TINY, f"data.path={tiny_corpus}", "evaluation.split=test",
                                f"paths.data_dir={tmp_path / 'data'}"))
    assert not (tmp_path / "data").exists()
    with pytest.raises(UserError, match=r"^evaluation.split=test: the corpus CORPUS has no test split"):
        scored_split("test", torch.zeros(3), None, "CORPUS")


@pytest.mark.parametrize("overrides, answer", [
    (["evaluation.split=train"], "invalid evaluation.split"),
    (["data.test_fraction=1"], "invalid data.test_fraction"),
    (["data.train_fraction=0.95", "data.test_fraction=0.05"], "leave no validation split"),
    (["data.test_fraction=0.05", "probe=recall", "evaluation.split=test"], "the probe's pairs are planted in the "
                                                                           "validation split only"),
])
def test_bad_split_settings_are_refused_in_one_line(compose_config, tiny_corpus, overrides, answer):
    with pytest.raises(UserError, match=answer):
        validate(compose_config(*TINY, f"data.path={tiny_corpus}", *overrides))


def test_text8_names_its_zip_by_url_and_sha256(compose_config):
    data = compose_config("data=text8").data
    assert data.url == "http://mattmahoney.net/dc/text8.zip" and len(data.sha256) == 64
    assert (data.train_fraction, data.test_fraction) == (0.9, 0.05)


@pytest.mark.slow
def test_a_byte_run_on_enwik8_scores_its_test_split_at_the_end_and_again_through_the_api(enwik_zip, tmp_path):
    """Trained from the file URL (tokenizer=byte, the invalid byte included); its end-of-run figures are the test
    split's, which the API scores again to the last digit from the run folder (the corpus's bytes read as they are),
    and its validation split's differ."""
    from gru_experiments import api

    url, sha256 = enwik_zip
    summary = api.train(["data=enwik8", f"data.url={url}", f"data.sha256={sha256}", f"data.cache_dir={tmp_path}/c",
                         "tokenizer=byte", "evaluation.split=test", "logger=none", "data.batch_size=4",
                         "data.seq_len=32", "trainer.max_steps=3", "model.steps_per_epoch=3",
                         "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "evaluation.samples.chars=10",
                         "evaluation.text.samples=0", "evaluation.curve_longest=64"], root=tmp_path)
    assert summary["evaluated_split"] == "test" and summary["tokenizer"] == "byte"
    assert summary["mode_evaluation"]["split_targets"] == int(len(PAYLOAD) * 0.05) - 1
    trained = api.load(summary["run_dir"])
    assert trained.evaluate(split="test")["stateful_bpc"] == summary["stateful_bpc"]
    assert trained.evaluate()["stateful_bpc"] == summary["stateful_bpc"]  # the run's own group says test
    assert trained.evaluate(split="validation")["stateful_bpc"] != summary["stateful_bpc"]


def test_a_byte_checkpoint_resumed_under_another_tokenizer_is_refused_naming_both():
    from gru_experiments.data.tokenizers import CharTokenizer
    from gru_experiments.runs.checkpoints import check_tokenizer

    with pytest.raises(UserError, match=r"was trained with a byte tokenizer \(256 bytes\), but this config builds a "
                                        r"char tokenizer \(2 characters\)"):
        check_tokenizer({"kind": "byte"}, 256, "last.ckpt", CharTokenizer("ab"))
    check_tokenizer({"kind": "byte"}, 256, "last.ckpt", ByteTokenizer())  # its own: accepted
