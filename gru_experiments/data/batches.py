"""Batches drawn on the training device, one gather (windows) or one slice (streams) each: docs/internals.md."""

from typing import Callable

import lightning as L
import torch
from torch import Tensor

from gru_experiments.data.token_ids import release_pages
from gru_experiments.errors import UserError

IGNORE_INDEX = -100  # targets with this value (padding) count for nothing
BATCHINGS = ("windows", "streams")  # training.batching: see the module docstring


def eval_windows(ids: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Consecutive windows covering every target once, each from a zero state; the last padded (IGNORE_INDEX)."""
    n_targets = ids.numel() - 1
    n_windows = -(-n_targets // seq_len)
    inputs = torch.zeros(n_windows * seq_len, dtype=torch.long, device=ids.device)
    targets = torch.full((n_windows * seq_len,), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    inputs[:n_targets] = ids[:-1]
    targets[:n_targets] = ids[1:]
    return inputs.view(n_windows, seq_len), targets.view(n_windows, seq_len)


PassSource = Callable[[int, int], Tensor]  # (pass index, step) -> the ids read then, at least as long as the split


class PassIds:
    """The ids read in pass p at step s: the split itself, or a `source`'s (never shorter than the split), moved
    to the split's device once per tensor."""

    def __init__(self, ids: Tensor, source: PassSource | None = None):
        self.ids, self.source = ids, source
        self._last: tuple[Tensor, Tensor] | None = None  # (the source's tensor, on the split's device)

    def __call__(self, pass_index: int, step: int) -> Tensor:
        if self.source is None:
            return self.ids
        ids = self.source(pass_index, step)
        if self._last is None or self._last[0] is not ids:
            if ids.dim() != 1 or ids.numel() < self.ids.numel():
                raise ValueError(f"pass {pass_index} has {ids.numel()} ids, fewer than the split's {self.ids.numel()}")
            self._last = (ids, ids.to(self.ids.device))
        return self._last[1]


class RandomWindowBatches:
    """An epoch of `steps` batches (inputs, targets) of random windows; with `pass_ids`, epoch e's batch at step
    s draws from pass_ids(e, s)."""

    def __init__(self, ids: Tensor, batch_size: int, seq_len: int, steps: int, generator: torch.Generator,
                 pass_ids: PassSource | None = None):
        self.ids, self.batch_size, self.seq_len, self.steps = ids, batch_size, seq_len, steps
        self.generator = generator
        self.offsets = torch.arange(seq_len + 1, device=ids.device)
        self.pass_ids = PassIds(ids, pass_ids)
        self.epoch, self.read = 0, 0  # the epoch being read and how many of its batches were taken

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        if self.read >= self.steps:  # the last epoch was read through; a resumed one was not
            self.epoch, self.read = self.epoch + 1, 0
        for _ in range(self.steps):
            ids = self.pass_ids(self.epoch, self.epoch * self.steps + self.read)
            n_starts = ids.numel() - self.seq_len  # last start leaves room for the shifted target
            starts = torch.randint(n_starts, (self.batch_size, 1), device=ids.device, generator=self.generator)
            windows = ids[starts + self.offsets].long()  # one gather: (B, T + 1), from the ids' own width
            release_pages(ids)  # a mapped split's pages given back (as nanoGPT maps its file anew every batch)
            self.read += 1
            yield windows[:, :-1], windows[:, 1:]

    # Restored on a mid-epoch resume: the rest of the epoch as the uninterrupted run drew it (docs/internals.md).
    def state_dict(self) -> dict:
        return {"generator_state": self.generator.get_state(), **self.position()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator_state"])
        self.load_position(state)

    def position(self) -> dict:
        return {"epoch": self.epoch, "read": self.read}

    def load_position(self, state: dict) -> None:
        self.epoch, self.read = int(state.get("epoch", 0)), int(state.get("read", 0))  # older checkpoints: none


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
    """Truncated BPTT: contiguous streams read in chunks of seq_len, one chunk of every stream a batch (inputs,
    targets, starts_pass); (pass, chunk, step) is the whole state. The layout: docs/internals.md, *Batches*."""

    def __init__(self, ids: Tensor, batch_size: int, seq_len: int, steps: int, seed: int,
                 rank: int = 0, world_size: int = 1, pass_ids: PassSource | None = None):
        self.ids, self.batch_size, self.seq_len, self.steps = ids, batch_size, seq_len, steps
        self.pass_ids = PassIds(ids, pass_ids)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        streams = batch_size * world_size
        self.chunks_per_pass = self.chunks_of(ids.numel())  # a pass over the split itself
        if self.chunks_per_pass < 1:
            raise UserError(
                f"training=streams: the training split has {ids.numel()} tokens, too few for {streams} streams "
                f"(data.batch_size {batch_size} x {world_size} processes) of at least one chunk of data.seq_len "
                f"{seq_len} each (it needs {streams * seq_len + seq_len}); use a smaller data.batch_size, a shorter "
                "data.seq_len or training=windows")
        self.pass_index, self.chunk, self.step = 0, 0, 0  # the next batch to read, and the batches read before it

    def __len__(self) -> int:
        return self.steps

    def chunks_of(self, tokens: int) -> int:
        """The chunks of every stream in a pass over `tokens` ids, whatever the offset."""
        return (tokens - self.seq_len) // (self.batch_size * self.world_size * self.seq_len)

    def offset(self, pass_index: int) -> int:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + pass_index)
        return int(torch.randint(self.seq_len, (1,), generator=generator))

    def pass_streams(self, pass_index: int, step: int = 0) -> tuple[Tensor, Tensor]:
        """This rank's (inputs, targets) of a pass as read at `step`: (batch_size, chunks * seq_len) views."""
        ids = self.pass_ids(pass_index, step)
        start, length = self.offset(pass_index), self.chunks_of(ids.numel()) * self.seq_len
        streams = self.batch_size * self.world_size
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        inputs = ids[start:start + streams * length].view(streams, length)[mine]
        targets = ids[start + 1:start + 1 + streams * length].view(streams, length)[mine]
        return inputs, targets

    def __iter__(self):
        for _ in range(self.steps):
            streams = self.pass_streams(self.pass_index, self.step)
            if self.chunk * self.seq_len >= streams[0].shape[1]:  # its ids shrank under it (a probe's new phase)
                self.pass_index, self.chunk = self.pass_index + 1, 0
                streams = self.pass_streams(self.pass_index, self.step)
            columns = slice(self.chunk * self.seq_len, (self.chunk + 1) * self.seq_len)
            starts_pass = self.chunk == 0
            self.chunk, self.step = self.chunk + 1, self.step + 1
            if self.chunk * self.seq_len == streams[0].shape[1]:
                self.pass_index, self.chunk = self.pass_index + 1, 0
            inputs, targets = streams[0][:, columns].long(), streams[1][:, columns].long()
            release_pages(self.ids)  # as the windows do
            yield inputs, targets, starts_pass

    # In checkpoints (for a mid-epoch resume); Lightning does not prefetch from a loader with a length.
    def state_dict(self) -> dict:
        return {"pass_index": self.pass_index, "chunk": self.chunk, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.pass_index, self.chunk = int(state["pass_index"]), int(state["chunk"])
        # An older checkpoint keeps no step: every pass before it had the split's chunks.
        self.step = int(state.get("step", self.pass_index * self.chunks_per_pass + self.chunk))


def run_steps(trainer, steps_per_epoch: int) -> int:
    """The optimiser steps `trainer` is set to take (max_steps, or its epochs if those end first)."""
    epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else None
    limits = [n for n in (trainer.max_steps, epochs and epochs * steps_per_epoch) if n and n > 0]
    return max(1, min(limits, default=1))


class CorpusDataModule(L.LightningDataModule):
    """A run's training and validation batches; with a recall probe, training reads its planted split."""

    def __init__(self, train_ids: Tensor, val_ids: Tensor, batch_size: int, seq_len: int,
                 steps_per_epoch: int, seed: int = 0, eval_batch_size: int | None = None,
                 batching: str = "windows", probe=None):
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
        self.probe = probe
        self.train_pass_ids: PassSource | None = probe.train if probe is not None else None
        self.generator: torch.Generator | None = None
        self.windows: RandomWindowBatches | None = None
        self.streams: StreamBatches | None = None
        self._restored: dict = {}  # a checkpoint's state (load_state_dict), for the readers built after it
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
            if "generator_state" in self._restored:
                self._restore_generator()
        if self.batching == "streams" and (self.streams is None or self.streams.ids.device != device):
            trainer = self.trainer
            rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
            self.streams = StreamBatches(self.train_ids, self.batch_size, self.seq_len, self.steps_per_epoch,
                                         self.seed, rank, world, pass_ids=self.train_pass_ids)
            if "streams" in self._restored:
                self.streams.load_state_dict(self._restored["streams"])
        if self.probe is not None and self.trainer is not None:  # the probe's phases are fractions of these
            self.probe.train.steps = run_steps(self.trainer, self.steps_per_epoch)

    def train_dataloader(self):
        if self.batching == "streams":
            return self.streams
        # One reader for the whole fit: it counts the epochs (a per-pass source reads epoch e's ids).
        windows = self.windows
        if windows is None or windows.ids is not self.train_ids or windows.generator is not self.generator:
            self.windows = RandomWindowBatches(self.train_ids, self.batch_size, self.seq_len, self.steps_per_epoch,
                                               self.generator, pass_ids=self.train_pass_ids)
            if "windows" in self._restored:
                self.windows.load_position(self._restored["windows"])
        return self.windows

    def val_dataloader(self):
        return EvalBatches(self.val_ids, self.eval_batch_size, self.seq_len)

    # In checkpoints: a resumed run reads the batches the uninterrupted run would have read.
    def state_dict(self) -> dict:
        state = {"generator_state": self.generator.get_state()} if self.generator is not None else {}
        if self.windows is not None:
            state["windows"] = self.windows.position()
        if self.streams is not None:
            state["streams"] = self.streams.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self._restored = {**self._restored, **state}
        if "streams" in state and self.streams is not None:
            self.streams.load_state_dict(state["streams"])
        if "windows" in state and self.windows is not None:
            self.windows.load_position(state["windows"])
        if "generator_state" in state and self.generator is not None:
            self._restore_generator()

    def _restore_generator(self) -> None:
        state = self._restored["generator_state"]
        try:
            self.generator.set_state(state)
        except RuntimeError:
            # A checkpoint of another device type (a GPU run resumed on a CPU): its generator's state does not carry
            # across, so the windows after the resume are drawn from a seed that state fixes.
            self.generator.manual_seed(int(state.long().sum()) + self.seed)
            print(f"resume: the checkpoint's window sampler ran on another device type than {self.generator.device}; "
                  "the windows from here on differ from an uninterrupted run's", flush=True)
