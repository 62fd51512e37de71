"""The corpus: where it comes from (a local file, an opt-in download, or one shipped in `corpora/`: Tiny Shakespeare,
or the Python standard library's source as `data=pystdlib`), how it is checked, split and encoded (`prepare_corpus`)."""

import codecs
import functools
import hashlib
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from gru_experiments.data.download import downloaded_corpus, sha256_of
from gru_experiments.data.recall_probe import NEEDS_CHAR, Probe, ProbeSettings, probe_symbols
from gru_experiments.data.token_ids import ids_dtype, ids_key, prepared_ids, release_pages
from gru_experiments.data.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    build_tokenizer,
    tokenizer_from_json,
    tokenizer_to_json,
)
from gru_experiments.errors import UserError
from gru_experiments.files import looks_utf16, utf8_text

# The corpora shipped in the package (xz -9e: no network needed), each found by the sha256 of its plain text: a corpus
# is its file and one YAML naming that hash (conf/data/pystdlib.yaml), no list here to edit.
CORPORA = Path(__file__).resolve().parent / "corpora"
SHIPPED_CORPUS = CORPORA / "tinyshakespeare.txt.xz"
SHIPPED_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # of the plain text
BYTE_ORDER_MARK = "\ufeff"
CHUNK_BYTES = 1 << 24  # a corpus is read and encoded in pieces this long (about 16 MB)


@functools.cache
def shipped_corpora() -> dict[str, Path]:
    """{sha256 of the plain text: file} of every corpus shipped in `corpora/` (read once a process: ~50 ms each)."""
    return {hashlib.sha256(lzma.decompress(path.read_bytes())).hexdigest(): path
            for path in sorted(CORPORA.glob("*.txt.xz"))}


def shipped_name(path: Path) -> str:
    return path.name.removesuffix(".txt.xz")


def corpus_path(path: str | None, url: str | None, sha256: str | None, cache_dir: str | Path) -> Path:
    """`path` if given, else the shipped corpus of that `sha256` (even with a URL of the same text: runs recorded
    before it shipped), else the cached download of `url` (opt-in), else SHIPPED_CORPUS."""
    if path:
        return Path(path).expanduser()
    if sha256 == SHIPPED_SHA256:  # the default's own hash: no need to read the others
        return SHIPPED_CORPUS
    if sha256 and sha256 in shipped_corpora():
        return shipped_corpora()[sha256]
    if not url and sha256:  # never another text than the one named: not Tiny Shakespeare in its place
        shipped = ", ".join(f"{shipped_name(path)}: {sha}" for sha, path in shipped_corpora().items())
        raise UserError(f"data.sha256={sha256} names no corpus shipped in the package ({shipped}), and no data.url "
                        "is given to download it: give data.path=FILE (data.sha256 then checks it), or leave "
                        "data.sha256 out for Tiny Shakespeare")
    if not url:
        return SHIPPED_CORPUS
    return downloaded_corpus(url, sha256, cache_dir)


def corpus_name(path: str | None, url: str | None, sha256: str | None) -> str:
    """A run's corpus as the report names it: a shipped one's name (tinyshakespeare, pystdlib), else its file's."""
    if path:
        return Path(path).name.removesuffix(".xz").removesuffix(".txt")
    if sha256 == SHIPPED_SHA256 or not (url or sha256):
        return shipped_name(SHIPPED_CORPUS)
    if shipped := shipped_corpora().get(sha256):
        return shipped_name(shipped)
    return Path(url.split("?")[0]).name.removesuffix(".zip") if url else shipped_name(SHIPPED_CORPUS)


@dataclass(frozen=True)
class CorpusText:
    source: Path
    sha256: str  # of the file's plain bytes (an .xz file's decompressed): `sha256sum FILE` for a plain text file
    read: str | None = None  # the text, where it was read whole (else `text` reads it when asked)

    @functools.cached_property
    def text(self) -> str:
        """The text without a UTF-8 byte-order mark (read here, whole, where it was not yet)."""
        return self.read if self.read is not None else read_corpus_text(self.source).text


def load_corpus(data) -> CorpusText:
    """The corpus the data group names, checked against data.sha256 given with data.path; a plain file is hashed, not
    read: its ids may be prepared already (data/token_ids.py)."""
    source = corpus_path(data["path"], data["url"], data.get("sha256"), data["cache_dir"])
    corpus = read_corpus_text(source) if source.suffix == ".xz" else hashed_corpus(source)
    if data["path"] and data.get("sha256") and corpus.sha256 != data["sha256"]:
        raise UserError(f"corpus file {source} has sha256 {corpus.sha256}, but data.sha256={data['sha256']}: it is "
                        "not the text that hash names (changed since?); give that text, or the file's sha256, or "
                        "leave data.sha256 out")
    return corpus


def check_corpus_file(path: Path) -> None:
    if not path.exists():
        raise UserError(f"corpus file not found: {path} (data.path); give an existing UTF-8 text file")
    if not path.is_file():
        raise UserError(f"corpus path is not a file: {path} (data.path)")


def hashed_corpus(path: Path) -> CorpusText:
    check_corpus_file(path)
    if path.stat().st_size == 0:
        raise UserError(f"corpus file is empty: {path}")
    return CorpusText(path, sha256_of(path))


def read_corpus(path: Path) -> str:
    """The corpus text (`.xz` decompressed, the shipped one checked); UserError if missing, empty or not UTF-8."""
    return read_corpus_text(path).text


def read_corpus_text(path: Path) -> CorpusText:
    """read_corpus's text with its sha256; a UTF-8 byte-order mark is dropped, saying so in a line."""
    check_corpus_file(path)
    data = path.read_bytes()
    if path.suffix == ".xz":
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as err:
            raise UserError(f"corpus file is not valid xz: {path} ({err})") from None
    expected = SHIPPED_SHA256 if path == SHIPPED_CORPUS else None  # the default, checked on every read
    if expected and (got := hashlib.sha256(data).hexdigest()) != expected:
        raise UserError(f"the shipped corpus {path} is damaged: sha256 {got}, expected {expected}; "
                        "reinstall the package or train on a local file: data.path=FILE")
    if not data:
        raise UserError(f"corpus file is empty: {path}")
    try:
        text = utf8_text(data)  # a byte-order mark dropped, as Python's utf-8-sig reads it
    except ValueError as err:
        bytes_too = "" if "compressed" in str(err) else ", or train on its bytes as they are: tokenizer=byte"
        raise UserError(f"corpus file is not UTF-8 text: {path} ({err}){bytes_too}") from None
    if data.startswith(BYTE_ORDER_MARK.encode()):  # a mark of the encoding, not a character: said, as CRLF is
        print(f"corpus {path} starts with a UTF-8 byte-order mark: dropped (it marks the encoding and is no "
              "character of the text)")
    return CorpusText(path, expected or hashlib.sha256(data).hexdigest(), text)


def text_chunks(corpus: CorpusText, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """The text in pieces of about `chunk_bytes` (a file not read whole is streamed), checked as read_corpus_text
    does."""
    if corpus.read is not None or "text" in corpus.__dict__:
        text = corpus.text
        yield from (text[i:i + chunk_bytes] for i in range(0, len(text), chunk_bytes))
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(corpus.source, "rb") as f, tqdm(total=corpus.source.stat().st_size, unit="B", unit_scale=True,
                                              desc=f"reading {corpus.source.name}", disable=None) as bar:
        first = True
        while True:
            block = f.read(chunk_bytes)
            if first and looks_utf16(block):
                read_corpus_text(corpus.source)  # raises its answer
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError:
                read_corpus_text(corpus.source)  # raises its answer, naming the byte and its line
                raise
            if first and text.startswith(BYTE_ORDER_MARK):
                text = text[1:]
                print(f"corpus {corpus.source} starts with a UTF-8 byte-order mark: dropped (it marks the encoding "
                      "and is no character of the text)")
            first = False
            bar.update(len(block))
            if text:
                yield text
            if not block:
                return


def check_long_enough(n_train: int, n_val: int, n_test: int, data, unit: str, source) -> None:
    seq_len = data["seq_len"]
    if n_train < seq_len + 1:
        raise UserError(f"corpus too short: the training split of {source} has {n_train} {unit}, fewer than one "
                        f"training window plus one (data.seq_len + 1 = {seq_len + 1}); use a longer corpus or a "
                        "shorter data.seq_len")
    if n_val < 2:
        raise UserError(f"corpus too short: the validation split of {source} has {n_val} {unit}, it needs at least "
                        "2; use a longer corpus or a smaller data.train_fraction")
    if data.get("test_fraction") and n_test < 2:
        raise UserError(f"corpus too short: the test split of {source} has {n_test} {unit}, it needs at least 2; "
                        "use a longer corpus or a larger data.test_fraction (0: no test split)")


def split_sizes(n: int, data) -> tuple[int, int, int]:
    """(train, validation, test) lengths of `n` symbols, contiguous in that order (data.test_fraction 0: no test)."""
    n_train, n_test = int(n * data["train_fraction"]), int(n * (data.get("test_fraction") or 0))
    return n_train, n - n_train - n_test, n_test


def split_parts(text: str, data) -> tuple[str, str, str]:
    n_train, n_val, _ = split_sizes(len(text), data)
    return text[:n_train], text[n_train:n_train + n_val], text[n_train + n_val:]


def split_text(text: str, train_fraction: float) -> tuple[str, str]:
    """(train, validation) of a corpus without a test split."""
    return split_parts(text, {"train_fraction": train_fraction})[:2]


@dataclass
class Corpus:
    tokenizer: object
    train_ids: Tensor  # (N_train,) integer ids: mapped from the prepared ids file (its width), int64 with a probe
    val_ids: Tensor  # (N_val,) int64: the plain split (the probe's plantings are in probe.validation)
    source: Path
    probe: Probe | None = None  # probe=recall: data/recall_probe.py
    sha256: str | None = None  # of the corpus file (CorpusText.sha256): summary.json and checkpoints record it
    test_ids: Tensor | None = None  # (N_test,) int64 where data.test_fraction gives a test split, else None

    def scored_split(self, name: str) -> Tensor:
        """The split that the end-of-run evaluation scores (evaluation.split): `scored_split`'s."""
        return scored_split(name, self.val_ids, self.test_ids, self.source)


def scored_split(name: str, val, test, source):
    """The split an evaluation scores (evaluation.split): `val`, or `test` (None where the corpus has none: refused)."""
    if name != "test":
        return val
    if test is None:
        raise no_test_split(source)
    return test


def no_test_split(source) -> UserError:
    return UserError(f"evaluation.split=test: the corpus {source} has no test split (data.test_fraction is 0); give "
                     "data.test_fraction (data=enwik8 and data=text8 have one), or leave evaluation.split=validation")


def prepare_corpus(data, tokenizer_settings, tokenizer_cache_dir, probe: ProbeSettings | None = None,
                   seed: int = 0, loaded: CorpusText | None = None) -> Corpus:
    """Load (or take `loaded`), split, fit the tokenizer and encode the splits (prepared once and mapped:
    data/token_ids.py); with `probe`, the recall probe seeded `seed`, its splits in memory."""
    kind = tokenizer_settings["kind"]
    if probe is not None and kind != "char":
        raise UserError(NEEDS_CHAR)
    loaded = loaded or load_corpus(data)
    if probe is not None:
        return probe_corpus(data, loaded, probe, seed)
    settings = dict(tokenizer_settings)
    key = ids_key(loaded.sha256, settings, data["train_fraction"], data.get("test_fraction") or 0)
    prepared = prepared_ids(tokenizer_cache_dir, key, loaded.sha256, lambda ids_file: write_ids(
        ids_file, loaded, settings, data, tokenizer_cache_dir), source=loaded.source)
    tokenizer = tokenizer_from_json(prepared.tokenizer_state)
    if kind == "char":
        say_crlf(loaded.source, prepared.record.get("crlf", 0))
    check_long_enough(prepared.n_train, prepared.n_val, prepared.n_test, data, "tokens", loaded.source)
    # The scored splits in memory at int32, the narrowest width torch indexes with (int64 would cost 8 bytes a
    # token: 0.8 GB for a gigabyte's validation split); the scoring widens only the chunk it feeds a model.
    val_ids, test_ids = prepared.val_ids.int(), prepared.test_ids.int() if data.get("test_fraction") else None
    release_pages(prepared.ids[prepared.n_train:])  # read once for the copies: their pages given back
    return Corpus(tokenizer, prepared.train_ids, val_ids, loaded.source, sha256=loaded.sha256, test_ids=test_ids)


def probe_corpus(data, loaded: CorpusText, probe: ProbeSettings, seed: int) -> Corpus:
    """probe=recall's corpus (char tokenizer): its symbols in the vocabulary, the splits in memory."""
    source, text = loaded.source, loaded.text
    say_crlf(source, text.count("\r\n"))
    train_text, val_text, test_text = split_parts(text, data)
    check_long_enough(len(train_text), len(val_text), len(test_text), data, "characters", source)
    symbols = probe_symbols(text, probe.keys)
    tokenizer = CharTokenizer.from_text(text, [symbols.opening, symbols.closing, *symbols.keys])
    encode = lambda s: torch.tensor(tokenizer.encode(s), dtype=torch.long)  # noqa: E731
    corpus = Corpus(tokenizer, encode(train_text), encode(val_text), source, sha256=loaded.sha256,
                    test_ids=encode(test_text) if data.get("test_fraction") else None)  # a token a character
    corpus.probe = Probe.build(probe, symbols, tokenizer, corpus.train_ids, corpus.val_ids, seed)
    return corpus


def write_ids(ids_file, loaded: CorpusText, settings: dict, data, tokenizer_cache_dir) -> dict:
    """The corpus's ids into `ids_file`: the char tokenizer's streamed through the text twice (its vocabulary, then
    the ids), the byte tokenizer's the file's bytes undecoded, SentencePiece's from the text."""
    kind, source, crlf = settings["kind"], loaded.source, 0
    if kind in ("char", "byte"):
        if kind == "char":
            counts, n_symbols, crlf = character_counts(loaded)
            codepoints = np.flatnonzero(counts)
            tokenizer = CharTokenizer(map(chr, codepoints.tolist()))
            table = np.zeros(len(counts), dtype=ids_dtype(tokenizer.vocab_size))
            table[codepoints] = np.arange(len(codepoints))
            chunks = (table[code_points(chunk)] for chunk in text_chunks(loaded))
        else:
            tokenizer = ByteTokenizer()
            n_symbols, chunks = corpus_bytes(loaded)
        n_train, n_val, n_test = split_sizes(n_symbols, data)
        check_long_enough(n_train, n_val, n_test, data, "characters" if kind == "char" else "bytes", source)
    else:  # SentencePiece: its pieces learnt from the training split
        train_text, val_text, test_text = split_parts(loaded.text, data)
        check_long_enough(len(train_text), len(val_text), len(test_text), data, "characters", source)
        tokenizer = build_tokenizer(kind, train_text, tokenizer_cache_dir,
                                    **{k: v for k, v in settings.items() if k != "kind"})
        chunks = [np.asarray(tokenizer.encode(t), dtype=np.int64) for t in (train_text, val_text, test_text)]
        n_train, n_val, n_test = map(len, chunks)
    record = {"sha256": loaded.sha256, "source": str(source), "tokenizer": tokenizer_to_json(tokenizer),
              "vocab_size": tokenizer.vocab_size, "dtype": ids_dtype(tokenizer.vocab_size).name,
              "n_train": n_train, "n_val": n_val, "n_test": n_test, "crlf": crlf}
    return ids_file.write(chunks, record)


def read_corpus_bytes(path: Path) -> bytes:
    """The corpus file's bytes as they are, not decoded (an .xz file's decompressed): the byte tokenizer's text."""
    check_corpus_file(path)
    return lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()


def corpus_bytes(loaded: CorpusText) -> tuple[int, Iterator[np.ndarray]]:
    """(length, chunks) of the corpus's bytes as they are (an .xz file's decompressed; a shipped corpus is small)."""
    if loaded.source.suffix == ".xz":
        data = read_corpus_bytes(loaded.source)
        return len(data), (np.frombuffer(data[i:i + CHUNK_BYTES], np.uint8) for i in range(0, len(data), CHUNK_BYTES))

    def chunks() -> Iterator[np.ndarray]:
        with open(loaded.source, "rb") as f:
            while block := f.read(CHUNK_BYTES):
                yield np.frombuffer(block, np.uint8)
    return loaded.source.stat().st_size, chunks()


def say_crlf(source: Path, crlf: int) -> None:
    if crlf:
        print(f"corpus {source} has Windows line ends ({crlf:,} of \\r\\n): \\r is a character of its own in the "
              "vocabulary, predicted before every line end; to leave it out, convert the file first, e.g. dos2unix")


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def character_counts(loaded: CorpusText) -> tuple[np.ndarray, int, int]:
    """(counts of every code point, characters, \\r\\n pairs) of the text, read in chunks."""
    counts, n_chars, crlf, last = np.zeros(0x110000, dtype=np.int64), 0, 0, ""
    for chunk in text_chunks(loaded):
        counts += np.bincount(code_points(chunk), minlength=len(counts))
        crlf += chunk.count("\r\n") + (last == "\r" and chunk[0] == "\n")
        n_chars, last = n_chars + len(chunk), chunk[-1]
    return counts, n_chars, crlf

