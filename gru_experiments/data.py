"""The corpus: where it comes from, how it is split, and how batches are drawn.

Batches never touch the host during training: the encoded training split lives
on the training device as one tensor, and each batch is one vectorised gather
(random windows) or one slice (contiguous streams) there: no Python loop over the
batch, no host-to-device copy.

Two ways to batch the training split (`training=windows|streams`, BATCHINGS):
    windows   random windows of seq_len tokens, each trained from the initial state
    streams   truncated BPTT: the split as batch_size contiguous streams read chunk by chunk,
              the state after one chunk (detached) starting the next (StreamBatches)
"""

from __future__ import annotations

import hashlib
import lzma
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch import Tensor

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_file
from gru_experiments.tokenizers import build_tokenizer

IGNORE_INDEX = -100  # targets with this value (padding) count for nothing
BATCHINGS = ("windows", "streams")  # training.batching: see the module docstring

# The default corpus, shipped in the package (xz -9e) so training needs no network: Tiny Shakespeare.
SHIPPED_CORPUS = Path(__file__).resolve().parent / "corpora" / "tinyshakespeare.txt.xz"
SHIPPED_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # of the plain text


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None) -> Path:
    """Fetch url into dest, verified (files.atomic_file: never a partial or unverified dest)."""
    digest = hashlib.sha256()
    with atomic_file(dest) as out, urllib.request.urlopen(url, timeout=60) as response:
        while block := response.read(1 << 20):
            out.write(block)
            digest.update(block)
        if sha256 and (got := digest.hexdigest()) != sha256:
            raise ValueError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}")
    return dest


def corpus_path(path: str | None, url: str | None, sha256: str | None, cache_dir: str | Path) -> Path:
    """The file to train on: `path` if given, else the cached download of `url` (opt-in), else the
    corpus shipped in the package (SHIPPED_CORPUS)."""
    if path:
        return Path(path).expanduser()
    if not url or sha256 == SHIPPED_SHA256:  # a URL of the same text (runs recorded before it shipped)
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


def read_corpus(path: Path) -> str:
    """The corpus text; UserError if the file is missing, empty or not UTF-8. A `.xz` file is
    decompressed; the shipped corpus is checked against its sha256."""
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
    if path == SHIPPED_CORPUS and (got := hashlib.sha256(data).hexdigest()) != SHIPPED_SHA256:
        raise UserError(f"the shipped corpus {path} is damaged: sha256 {got}, expected {SHIPPED_SHA256}; "
                        "reinstall the package or train on a local file: data.path=FILE")
    if not data:
        raise UserError(f"corpus file is empty: {path}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(f"corpus file is not UTF-8 text: {path} (byte 0x{data[err.start]:02x} at offset {err.start}, "
                        f"line {line}); convert it first, e.g. iconv -f latin1 -t utf-8") from None


def check_long_enough(n_train: int, n_val: int, seq_len: int, unit: str, source) -> None:
    """Training needs one window plus its shifted target; validation needs one target."""
    if n_train < seq_len + 1:
        raise UserError(f"corpus too short: the training split of {source} has {n_train} {unit}, fewer than one "
                        f"training window plus one (data.seq_len + 1 = {seq_len + 1}); use a longer corpus or a "
                        "shorter data.seq_len")
    if n_val < 2:
        raise UserError(f"corpus too short: the validation split of {source} has {n_val} {unit}, it needs at least "
                        "2; use a longer corpus or a smaller data.train_fraction")


def split_text(text: str, train_fraction: float) -> tuple[str, str]:
    """Contiguous split: the first train_fraction of the characters trains, the rest validates."""
    cut = int(len(text) * train_fraction)
    return text[:cut], text[cut:]


@dataclass
class Corpus:
    tokenizer: object
    train_ids: Tensor  # (N_train,) int64
    val_ids: Tensor  # (N_val,) int64
    source: Path


def prepare_corpus(data_cfg, tokenizer_cfg, tokenizer_cache_dir) -> Corpus:
    """Load, split, fit the tokenizer, encode both splits.

    The char tokenizer's vocabulary is every character of the whole corpus (as char-rnn and
    nanoGPT do), so any UTF-8 text trains: a character that occurs only in the validation split
    gets a token the model never saw as a target, an untrained embedding and output row, and
    finite (large) cost where it occurs; nothing else of the validation text is used. SentencePiece
    learns its pieces from the training split only (its pieces are statistics of the text)."""
    settings = {k: v for k, v in dict(tokenizer_cfg).items() if k != "kind"}
    source = corpus_path(data_cfg.path, data_cfg.url, data_cfg.sha256, data_cfg.cache_dir)
    text = read_corpus(source)
    train_text, val_text = split_text(text, data_cfg.train_fraction)
    # Characters first (cheap, before a tokenizer is trained); tokens after: never more than characters.
    check_long_enough(len(train_text), len(val_text), data_cfg.seq_len, "characters", source)
    fit_text = text if tokenizer_cfg.kind == "char" else train_text
    tokenizer = build_tokenizer(tokenizer_cfg.kind, fit_text, tokenizer_cache_dir, **settings)
    encode = lambda s: torch.tensor(tokenizer.encode(s), dtype=torch.long)  # noqa: E731
    corpus = Corpus(tokenizer, encode(train_text), encode(val_text), source)
    check_long_enough(corpus.train_ids.numel(), corpus.val_ids.numel(), data_cfg.seq_len, "tokens", source)
    return corpus


def eval_windows(ids: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Cut a split into consecutive windows that cover every target exactly once.

    Window k predicts ids[k*T + 1 : (k+1)*T + 1] from ids[k*T : (k+1)*T], each from a
    zero state. The last window is padded (targets IGNORE_INDEX), so all len(ids) - 1
    targets of the split are scored, not a random sample of them.
    """
    n_targets = ids.numel() - 1
    n_windows = -(-n_targets // seq_len)
    inputs = torch.zeros(n_windows * seq_len, dtype=torch.long, device=ids.device)
    targets = torch.full((n_windows * seq_len,), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    inputs[:n_targets] = ids[:-1]
    targets[:n_targets] = ids[1:]
    return inputs.view(n_windows, seq_len), targets.view(n_windows, seq_len)


class RandomWindowBatches:
    """An epoch of `steps` batches of random windows, drawn on the data's device.

    Each batch is (inputs, targets), both (batch_size, seq_len), targets shifted by one.
    """

    def __init__(self, ids: Tensor, batch_size: int, seq_len: int, steps: int, generator: torch.Generator):
        self.ids, self.batch_size, self.seq_len, self.steps = ids, batch_size, seq_len, steps
        self.generator = generator
        self.offsets = torch.arange(seq_len + 1, device=ids.device)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        n_starts = self.ids.numel() - self.seq_len  # last start leaves room for the shifted target
        for _ in range(self.steps):
            starts = torch.randint(n_starts, (self.batch_size, 1), device=self.ids.device, generator=self.generator)
            windows = self.ids[starts + self.offsets]  # one gather: (B, T + 1)
            yield windows[:, :-1], windows[:, 1:]

    # Lightning checkpoints a loader that has state_dict/load_state_dict and restores it on a
    # mid-epoch resume. The generator is all the state there is: the resumed epoch draws its
    # remaining batches from it (Lightning stops the epoch after steps_per_epoch batches in
    # all), which are exactly the batches the uninterrupted run drew. The data module saves
    # the same generator; restoring it twice sets the same state.
    def state_dict(self) -> dict:
        return {"generator_state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator_state"])


class EvalBatches:
    """The whole split as consecutive windows, in batches (see `eval_windows`)."""

    def __init__(self, ids: Tensor, batch_size: int, seq_len: int):
        self.inputs, self.targets = eval_windows(ids, seq_len)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return -(-self.inputs.shape[0] // self.batch_size)

    def __iter__(self):
        for i in range(0, self.inputs.shape[0], self.batch_size):
            yield self.inputs[i : i + self.batch_size], self.targets[i : i + self.batch_size]


class StreamBatches:
    """Truncated BPTT (as char-rnn and AWD-LSTM train): the training split cut into contiguous
    streams, read in consecutive chunks of seq_len tokens, one chunk of every stream per batch.

    A pass over the split starts at a seeded random offset in [0, seq_len) (so chunk boundaries
    move from pass to pass) and cuts ids[offset:] into batch_size x world_size streams of the same
    whole number of chunks, the same in every pass (as many as the largest offset allows); the tail
    after them, less than one chunk of every stream and one chunk more, is not read. Rank r
    reads streams r*batch_size ... (r+1)*batch_size - 1, so no two DDP ranks share a stream.

    Each batch is (inputs, targets, starts_pass): starts_pass is True for the first chunk of a pass,
    where training starts from the initial state; every other chunk continues the state of the
    previous one (LanguageModelTask.training_step). A Trainer epoch of `steps` batches continues
    where the last one stopped and wraps into a new pass when a pass ends, so the recipe's steps and
    tokens are those of windows mode. The position (pass, chunk) is the whole state of the reader:
    the offset of a pass is a function of the seed and the pass number.
    """

    def __init__(self, ids: Tensor, batch_size: int, seq_len: int, steps: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.ids, self.batch_size, self.seq_len, self.steps = ids, batch_size, seq_len, steps
        self.seed, self.rank, self.world_size = seed, rank, world_size
        streams = batch_size * world_size
        self.chunks_per_pass = (ids.numel() - seq_len) // (streams * seq_len)  # the worst offset, seq_len - 1
        if self.chunks_per_pass < 1:
            raise UserError(
                f"training=streams: the training split has {ids.numel()} tokens, too few for {streams} streams "
                f"(data.batch_size {batch_size} x {world_size} processes) of at least one chunk of data.seq_len "
                f"{seq_len} each (it needs {streams * seq_len + seq_len}); use a smaller data.batch_size, a shorter "
                "data.seq_len or training=windows")
        self.pass_index, self.chunk = 0, 0  # the next batch to read

    def __len__(self) -> int:
        return self.steps

    def offset(self, pass_index: int) -> int:
        """Where pass `pass_index` starts: seeded, the same on every rank."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + pass_index)
        return int(torch.randint(self.seq_len, (1,), generator=generator))

    def pass_streams(self, pass_index: int) -> tuple[Tensor, Tensor]:
        """This rank's (inputs, targets) of a pass: (batch_size, chunks_per_pass * seq_len) views."""
        start, length = self.offset(pass_index), self.chunks_per_pass * self.seq_len
        streams = self.batch_size * self.world_size
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        inputs = self.ids[start:start + streams * length].view(streams, length)[mine]
        targets = self.ids[start + 1:start + 1 + streams * length].view(streams, length)[mine]
        return inputs, targets

    def __iter__(self):
        streams = None
        for _ in range(self.steps):
            if streams is None or self.chunk == 0:
                streams = self.pass_streams(self.pass_index)
            columns = slice(self.chunk * self.seq_len, (self.chunk + 1) * self.seq_len)
            starts_pass = self.chunk == 0
            self.chunk += 1
            if self.chunk == self.chunks_per_pass:
                self.pass_index, self.chunk = self.pass_index + 1, 0
            yield streams[0][:, columns], streams[1][:, columns], starts_pass

    # The position travels in checkpoints (here for a mid-epoch resume, through the data module
    # for every resume); Lightning does not prefetch from a loader with a length.
    def state_dict(self) -> dict:
        return {"pass_index": self.pass_index, "chunk": self.chunk}

    def load_state_dict(self, state: dict) -> None:
        self.pass_index, self.chunk = int(state["pass_index"]), int(state["chunk"])


class CorpusDataModule(L.LightningDataModule):
    def __init__(self, train_ids: Tensor, val_ids: Tensor, batch_size: int, seq_len: int,
                 steps_per_epoch: int, seed: int = 0, eval_batch_size: int | None = None,
                 batching: str = "windows"):
        super().__init__()
        if batching not in BATCHINGS:
            raise UserError(f"invalid training.batching={batching!r}: must be one of {', '.join(BATCHINGS)}")
        if train_ids.numel() < seq_len + 1:
            raise UserError(
                f"the training split has {train_ids.numel()} tokens, fewer than one window "
                f"(seq_len + 1 = {seq_len + 1}); use a longer corpus or a shorter data.seq_len"
            )
        self.train_ids, self.val_ids = train_ids, val_ids
        self.batch_size, self.seq_len, self.steps_per_epoch = batch_size, seq_len, steps_per_epoch
        self.seed = seed
        self.eval_batch_size = eval_batch_size or batch_size
        self.batching = batching
        self.generator: torch.Generator | None = None
        self._pending_generator_state: Tensor | None = None
        self.streams: StreamBatches | None = None
        self._pending_stream_state: dict | None = None
        if batching == "streams":  # refuse a split too short for the streams now, before any work
            StreamBatches(train_ids, batch_size, seq_len, steps_per_epoch, seed)

    @property
    def device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def setup(self, stage: str) -> None:
        device = self.device
        self.train_ids = self.train_ids.to(device)
        self.val_ids = self.val_ids.to(device)
        if self.generator is None or self.generator.device != device:
            # Each DDP rank draws different windows.
            rank = self.trainer.global_rank if self.trainer is not None else 0
            self.generator = torch.Generator(device=device).manual_seed(self.seed + rank)
            if self._pending_generator_state is not None:
                self.generator.set_state(self._pending_generator_state)
        if self.batching == "streams" and (self.streams is None or self.streams.ids.device != device):
            trainer = self.trainer
            rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
            self.streams = StreamBatches(self.train_ids, self.batch_size, self.seq_len, self.steps_per_epoch,
                                         self.seed, rank, world)
            if self._pending_stream_state is not None:
                self.streams.load_state_dict(self._pending_stream_state)

    def train_dataloader(self):
        if self.batching == "streams":
            return self.streams
        return RandomWindowBatches(self.train_ids, self.batch_size, self.seq_len, self.steps_per_epoch, self.generator)

    def val_dataloader(self):
        return EvalBatches(self.val_ids, self.eval_batch_size, self.seq_len)

    # The window sampler's random state and the streams' position travel in checkpoints, so a
    # resumed run reads the batches the uninterrupted run would have read.
    def state_dict(self) -> dict:
        state = {"generator_state": self.generator.get_state()} if self.generator is not None else {}
        if self.streams is not None:
            state["streams"] = self.streams.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if "streams" in state:
            self._pending_stream_state = state["streams"]
            if self.streams is not None:
                self.streams.load_state_dict(state["streams"])
        if "generator_state" in state:
            self._pending_generator_state = state["generator_state"]
            if self.generator is not None:
                self.generator.set_state(self._pending_generator_state)
