"""The corpus: where it comes from (a local file, an opt-in download, or one shipped in `corpora/`: Tiny Shakespeare,
or the Python standard library's source as `data=pystdlib`), how it is checked, split and encoded (`prepare_corpus`)."""

import hashlib
import lzma
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from gru_experiments.data.recall_probe import NEEDS_CHAR, Probe, ProbeSettings, probe_symbols
from gru_experiments.data.tokenizers import build_tokenizer
from gru_experiments.errors import UserError
from gru_experiments.files import atomic_file

# The corpora shipped in the package (xz -9e) so training needs no network, by the sha256 of their plain text. The
# default: Tiny Shakespeare. data=pystdlib (conf/data/pystdlib.yaml names its sha256): 46 modules of CPython 3.11.7's
# standard library (PSF licence, corpora/pystdlib.LICENSE.txt), built by tools/build_pystdlib_corpus.py.
CORPORA = Path(__file__).resolve().parent / "corpora"
SHIPPED_CORPUS = CORPORA / "tinyshakespeare.txt.xz"
SHIPPED_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # of the plain text
PYSTDLIB_SHA256 = "0580ce98cfae237574409a8795e9ef8178eecde50b7c1c985f0ae59bb2121230"
SHIPPED = {SHIPPED_SHA256: SHIPPED_CORPUS, PYSTDLIB_SHA256: CORPORA / "pystdlib.txt.xz"}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None) -> Path:
    """Fetch url into dest, verified, atomically."""
    digest = hashlib.sha256()
    with atomic_file(dest) as out, urllib.request.urlopen(url, timeout=60) as response:
        while block := response.read(1 << 20):
            out.write(block)
            digest.update(block)
        if sha256 and (got := digest.hexdigest()) != sha256:
            raise ValueError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}")
    return dest


def corpus_path(path: str | None, url: str | None, sha256: str | None, cache_dir: str | Path) -> Path:
    """`path` if given, else the shipped corpus of that `sha256` (even with a URL of the same text: runs recorded
    before it shipped), else the cached download of `url` (opt-in), else SHIPPED_CORPUS."""
    if path:
        return Path(path).expanduser()
    if sha256 in SHIPPED:
        return SHIPPED[sha256]
    if not url:
        return SHIPPED_CORPUS
    cached = Path(cache_dir) / Path(url.split("?")[0]).name
    if not cached.exists() or (sha256 and sha256_of(cached) != sha256):
        print(f"downloading {url} -> {cached}")
        try:
            download(url, cached, sha256)
        except (OSError, ValueError) as err:  # no network, HTTP error, checksum mismatch
            raise UserError(f"could not download the corpus from {url} ({err}); "
                            "train on a local file instead: data.path=FILE") from None
    return cached


def corpus_name(path: str | None, url: str | None, sha256: str | None) -> str:
    """A run's corpus as the report names it: a shipped one's name (tinyshakespeare, pystdlib), else its file's."""
    if path:
        return Path(path).name.removesuffix(".xz").removesuffix(".txt")
    shipped = SHIPPED.get(sha256) or (SHIPPED_CORPUS if not url else None)
    return shipped.name.removesuffix(".txt.xz") if shipped else Path(url.split("?")[0]).name


def read_corpus(path: Path) -> str:
    """The corpus text (`.xz` decompressed, the shipped one checked); UserError if missing, empty or not UTF-8."""
    if not path.exists():
        raise UserError(f"corpus file not found: {path} (data.path); give an existing UTF-8 text file")
    if not path.is_file():
        raise UserError(f"corpus path is not a file: {path} (data.path)")
    data = path.read_bytes()
    if path.suffix == ".xz":
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as err:
            raise UserError(f"corpus file is not valid xz: {path} ({err})") from None
    expected = next((sha for sha, shipped in SHIPPED.items() if shipped == path), None)
    if expected and (got := hashlib.sha256(data).hexdigest()) != expected:
        raise UserError(f"the shipped corpus {path} is damaged: sha256 {got}, expected {expected}; "
                        "reinstall the package or train on a local file: data.path=FILE")
    if not data:
        raise UserError(f"corpus file is empty: {path}")
    head = data[:4096]
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or head.count(b"\x00") > len(head) // 4:
        raise UserError(f"corpus file is not UTF-8 text: {path} looks like UTF-16 (a byte-order mark, or a NUL byte "
                        "every other byte); convert it first, e.g. iconv -f utf-16 -t utf-8") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(f"corpus file is not UTF-8 text: {path} (byte 0x{data[err.start]:02x} at offset {err.start}, "
                        f"line {line}); convert it first, e.g. iconv -f latin1 -t utf-8") from None


def check_long_enough(n_train: int, n_val: int, seq_len: int, unit: str, source) -> None:
    if n_train < seq_len + 1:
        raise UserError(f"corpus too short: the training split of {source} has {n_train} {unit}, fewer than one "
                        f"training window plus one (data.seq_len + 1 = {seq_len + 1}); use a longer corpus or a "
                        "shorter data.seq_len")
    if n_val < 2:
        raise UserError(f"corpus too short: the validation split of {source} has {n_val} {unit}, it needs at least "
                        "2; use a longer corpus or a smaller data.train_fraction")


def split_text(text: str, train_fraction: float) -> tuple[str, str]:
    cut = int(len(text) * train_fraction)
    return text[:cut], text[cut:]


@dataclass
class Corpus:
    tokenizer: object
    train_ids: Tensor  # (N_train,) int64
    val_ids: Tensor  # (N_val,) int64: the plain split (the probe's plantings are in probe.validation)
    source: Path
    probe: Probe | None = None  # probe=recall: data/recall_probe.py


def prepare_corpus(data_cfg, tokenizer_cfg, tokenizer_cache_dir, probe: ProbeSettings | None = None,
                   seed: int = 0) -> Corpus:
    """Load, split, fit the tokenizer, encode both splits; with `probe`, the recall probe seeded `seed`. The char
    vocabulary is the whole corpus's characters (as char-rnn and nanoGPT: any UTF-8 text trains) and the
    probe's; SentencePiece learns its pieces from the training split only."""
    if probe is not None and tokenizer_cfg.kind != "char":
        raise UserError(NEEDS_CHAR)
    settings = {k: v for k, v in dict(tokenizer_cfg).items() if k != "kind"}
    source = corpus_path(data_cfg.path, data_cfg.url, data_cfg.sha256, data_cfg.cache_dir)
    text = read_corpus(source)
    if (crlf := text.count("\r\n")) and tokenizer_cfg.kind == "char":
        print(f"corpus {source} has Windows line ends ({crlf:,} of \\r\\n): \\r is a character of its own in the "
              "vocabulary, predicted before every line end; to leave it out, convert the file first, e.g. dos2unix")
    train_text, val_text = split_text(text, data_cfg.train_fraction)
    # Characters first (cheap, before a tokenizer is trained); tokens after: never more than characters.
    check_long_enough(len(train_text), len(val_text), data_cfg.seq_len, "characters", source)
    symbols = probe_symbols(text, probe.keys) if probe is not None else None
    fit_text = text if tokenizer_cfg.kind == "char" else train_text
    extra = [symbols.opening, symbols.closing, *symbols.keys] if symbols else []
    tokenizer = build_tokenizer(tokenizer_cfg.kind, fit_text, tokenizer_cache_dir, extra, **settings)
    encode = lambda s: torch.tensor(tokenizer.encode(s), dtype=torch.long)  # noqa: E731
    corpus = Corpus(tokenizer, encode(train_text), encode(val_text), source)
    check_long_enough(corpus.train_ids.numel(), corpus.val_ids.numel(), data_cfg.seq_len, "tokens", source)
    if probe is not None:
        corpus.probe = Probe.build(probe, symbols, tokenizer, corpus.train_ids, corpus.val_ids, seed)
    return corpus
