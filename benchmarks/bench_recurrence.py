"""Throughput of our hand-written recurrence, in float32 and with bf16 matmuls, vs PyTorch's
nn.GRU / nn.LSTM / nn.RNN: whole models, side by side.

    python benchmarks/bench_recurrence.py                      # all models, ~15 min on a 2-core CPU
    python benchmarks/bench_recurrence.py --quick              # small models, few repetitions, ~1 min
    python benchmarks/bench_recurrence.py --models astra_alpha,leviathan --steps 7 --reference
    python benchmarks/bench_recurrence.py --no-sampling --no-builtin   # only the precision comparison
    python benchmarks/bench_recurrence.py --models astra_alpha_rnn,astra_beta_rnn   # Elman RNN vs nn.RNN

Both sides are whole language models of the same shape: the same embedding, dropout,
[LayerNorm] and head around either our layers (`RecurrentLM`, fast path, the default)
or one multi-layer nn.GRU / nn.LSTM. Note the GRUs are not the same function (ours
applies the reset gate before the candidate matmul, PyTorch's after), only the same
shape and cost class; the LSTMs differ only in nn.LSTM's extra hidden-side bias.

Training: one step = forward + cross-entropy + backward + AdamW step, on random tokens
(batch 64, sequence 128 by default). Ours in float32 (`trainer.precision=32-true`), ours
with bf16 matmul inputs at every weight (`low_precision_matmuls=always`), ours as
`low_precision_matmuls=auto` picks on this machine, and built-in (float32) alternate step
by step after a warm-up (A B C D D C B A ...), so load from other processes on a shared
machine hits all alike; the table reports medians and the ratios within the run. `--reference`
also times the readable per-step reference layers (the notebook-style number), for context.

Sampling: stateful, one token at a time: `model(tokens[:, -1:], state)` carrying the
state, sampled from the softmax, at batch 1 and batch 64, for two generation lengths:
equal tokens/s at both lengths means the cost per token does not grow with length.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gru_experiments.models.precision import MatmulPrecision, has_fast_bf16, resolve  # noqa: E402
from gru_experiments.models.recurrent import RecurrentLM  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    cell: str
    embedding_dim: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    dropout: float = 0.1
    layer_norm: bool = False

    def describe(self) -> str:
        ln = ", LN" if self.layer_norm else ""
        return (f"{self.name} ({self.cell.upper()} {self.embedding_dim}/{self.hidden_size}/{self.num_layers}, "
                f"V {self.vocab_size}{ln})")


def load_shapes(names=None) -> dict[str, Shape]:
    """Architectures of conf/model/*.yaml as train.py composes them (Hydra's compose API: a variant that extends its
    base config gets the base's keys); vocabularies: 65 characters (Tiny Shakespeare) for char models, the spm size
    for the Scribe models (their config chooses tokenizer=spm). `names`: only these (and the bases of their *_rnn)."""
    from hydra import compose, initialize_config_dir

    shapes, configs = {}, sorted((REPO / "conf/model").glob("*.yaml"))
    wanted = None if names is None else {name.removesuffix("_rnn") for name in names} | set(names)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for path in (p for p in configs if wanted is None or p.stem in wanted):
            cfg = compose(config_name="train", overrides=[f"model={path.stem}"])
            arch = cfg.model.architecture
            if arch.get("cell") not in ("gru", "lstm", "rnn"):  # not a family with nn.GRU/LSTM/RNN's shape
                continue
            vocab = cfg.tokenizer.vocab_size if cfg.tokenizer.kind == "spm" else 65
            shapes[cfg.model.name] = Shape(cfg.model.name, arch.cell, arch.embedding_dim, arch.hidden_size,
                                           arch.num_layers, vocab, arch.get("dropout", 0.1),
                                           arch.get("layer_norm", False))
    # The Elman RNN at Astra-α's and Astra-β's shapes (the ladder's `rnn` config comes from conf/ above).
    for base in ("astra_alpha", "astra_beta"):
        if base in shapes:
            b = shapes[base]
            shapes[f"{base}_rnn"] = Shape(f"{base}_rnn", "rnn", b.embedding_dim, b.hidden_size, b.num_layers,
                                          b.vocab_size, b.dropout, b.layer_norm)
    return shapes


class Parser(argparse.ArgumentParser):
    """argparse with a bad option answered in one line that names it (exit status 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message}\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (--threads -1 is refused in one line, not by torch with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 (--windows 128,512), refused in one line otherwise."""
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"must be integers >= 1, comma-separated (e.g. 128,512), got {text!r}")
    return [int(part) for part in parts]


def device_arg(text: str) -> torch.device:
    """An argparse type: a device this machine has (models/devices.py): --device banana, or cuda without a GPU, is
    refused in one line, not by torch with a traceback."""
    from gru_experiments.models.devices import InvalidDevice, resolve_device

    try:
        return resolve_device(text, "--device")
    except InvalidDevice as error:
        raise argparse.ArgumentTypeError(error.reason) from None


def model_config(name: str):
    """A model's train config (architecture, recipe, tokenizer, batch shape), composed as train.py composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"model={name}"])


def trained_model(text: str) -> str:
    """An argparse type: a model of conf/model/ that an optimizer trains (a counted n-gram has no training step)."""
    from gru_experiments.models.protocol import meta_model

    names = sorted(path.stem for path in (REPO / "conf" / "model").glob("*.yaml"))
    if text not in names:
        raise argparse.ArgumentTypeError(f"no model {text!r} in conf/model/: give one of {', '.join(names)}")
    if not meta_model(model_config(text).model.architecture).trainable:
        raise argparse.ArgumentTypeError(f"{text} is a counted model (its weights are counted from the text, with no "
                                         "optimizer or training step): give a trained one")
    return text


ORDER = ["astra_alpha", "astra_beta", "astra_gamma", "scribe_alpha", "scribe_beta", "scribe_gamma", "leviathan"]


class BuiltinLM(nn.Module):
    """The baseline: RecurrentLM's layout around one nn.GRU / nn.LSTM / nn.RNN (benchmarks only)."""

    def __init__(self, s: Shape):
        super().__init__()
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}[s.cell]  # nn.RNN: tanh, like ours
        self.embedding = nn.Embedding(s.vocab_size, s.embedding_dim)
        # nn.GRU's dropout sits between layers; the one below is the after-last-layer one.
        self.rnn = rnn(s.embedding_dim, s.hidden_size, s.num_layers, batch_first=True,
                       dropout=s.dropout if s.num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(s.dropout)
        self.norm = nn.LayerNorm(s.hidden_size) if s.layer_norm else nn.Identity()
        self.head = nn.Linear(s.hidden_size, s.vocab_size)

    def forward(self, tokens, state=None):
        x, state = self.rnn(self.embedding(tokens), state)
        return self.head(self.norm(self.dropout(x))), state


def build(kind: str, s: Shape, device) -> nn.Module:
    """kind: builtin | reference | ours (float32) | bf16 (every weight) | auto (as
    low_precision_matmuls=auto picks on this device)."""
    if kind == "builtin":
        return BuiltinLM(s).to(device)
    model = RecurrentLM(s.vocab_size, s.cell, s.embedding_dim, s.hidden_size, s.num_layers, s.dropout,
                        s.layer_norm, implementation="reference" if kind == "reference" else "fast").to(device)
    if kind == "bf16":
        model.set_matmul_precision(MatmulPrecision())
    elif kind == "auto":
        model.set_matmul_precision(resolve("auto", None, device))
    return model


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """One model with its optimiser and a fixed random batch; `step()` returns seconds."""

    def __init__(self, model, s: Shape, batch: int, seq_len: int, device):
        self.model, self.device = model.train(), device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        g = torch.Generator().manual_seed(0)
        data = torch.randint(0, s.vocab_size, (batch, seq_len + 1), generator=g).to(device)
        self.inputs, self.targets = data[:, :-1], data[:, 1:]

    def step(self) -> float:
        sync(self.device)
        started = time.perf_counter()
        logits, _ = self.model(self.inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        sync(self.device)
        return time.perf_counter() - started


@torch.no_grad()
def sample_seconds(model, s: Shape, batch: int, length: int, device) -> float:
    """Stateful sampling: one token in, one token out, the state carried along."""
    model.eval()
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
    state = None
    sync(device)
    started = time.perf_counter()
    for _ in range(length):
        logits, state = model(tokens[:, -1:], state)
        tokens = torch.multinomial(torch.softmax(logits[:, -1], -1), 1)
    sync(device)
    model.train()
    return time.perf_counter() - started


def interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each fn, calls alternating A B B A ... after a warm-up."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else reversed(names):
            times[name].append(fns[name]())
    return {name: statistics.median(t) for name, t in times.items()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"- CPU: {cpu_model()}, {cores} usable cores (os.cpu_count {os.cpu_count()})",
             f"- torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
             f"inter-op threads {torch.get_num_interop_threads()}, MKL {torch.backends.mkl.is_available()}, "
             f"oneDNN {torch.backends.mkldnn.is_available()}",
             f"- Python {platform.python_version()}, {platform.system()} {platform.release()}"]
    if torch.cuda.is_available():
        lines.append(f"- CUDA {torch.version.cuda}: "
                     f"{torch.cuda.get_device_name(device if device.type == 'cuda' else 0)}")
    lines.append(f"- device used: {device}; load average at start (1/5/15 min): {load_average()}")
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def fmt(x: float) -> str:
    return f"{x / 1000:,.1f}k" if x >= 1000 else f"{x:,.0f}"


def main(argv=None) -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help=f"comma-separated, from {','.join(ORDER)} (default: all)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="timed training steps per side (default 7; 3 for the largest models; --quick 3)")
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--lengths", default=None, help="two sampling lengths, e.g. 50,200 (default 16,64; --quick 8,32)")
    p.add_argument("--sample-repeats", type=positive_int, default=3)
    p.add_argument("--no-sampling", action="store_true")
    p.add_argument("--no-builtin", action="store_true", help="leave out nn.GRU / nn.LSTM (training table)")
    p.add_argument("--reference", action="store_true", help="also time the readable reference (training, 2 steps)")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="Astra-α, Astra-β, Scribe-α; fewer repetitions (~1 min)")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    default_models = ["astra_alpha", "astra_beta", "scribe_alpha"] if args.quick else ORDER
    names = args.models.split(",") if args.models else default_models
    shapes = load_shapes(names)
    unknown = [n for n in names if n not in shapes]
    if unknown:
        p.error(f"--models: unknown or not a GRU/LSTM/RNN config: {unknown}; known: {sorted(load_shapes())}")
    lengths = [int(v) for v in (args.lengths or ("8,32" if args.quick else "16,64")).split(",")]

    print("## Machine\n")
    print(machine_info(device))
    print(f"- fast bf16 on this device (what low_precision_matmuls=auto looks for): {has_fast_bf16(device)}")
    print(f"\nbatch {args.batch}, sequence {args.seq_len}; training step = forward + backward + AdamW; "
          f"medians of interleaved repetitions\n", flush=True)

    started = time.perf_counter()
    train_rows, sample_rows = [], []
    for name in names:
        s = shapes[name]
        big = s.hidden_size >= 768
        steps = args.steps or (3 if args.quick or big else 7)
        torch.manual_seed(0)
        kinds = ("ours", "bf16", "auto") + (() if args.no_builtin else ("builtin",))
        models = {kind: build(kind, s, device) for kind in kinds}
        for kind in kinds[1:]:
            if kind != "builtin":
                models[kind].load_state_dict(models["ours"].state_dict())
        trainers = {kind: Trainer(m, s, args.batch, args.seq_len, device) for kind, m in models.items()}
        t0 = time.perf_counter()
        sec = interleaved({k: tr.step for k, tr in trainers.items()}, steps)
        tokens = args.batch * args.seq_len
        ref = ""
        if args.reference:
            reference = Trainer(build("reference", s, device), s, args.batch, args.seq_len, device)
            ref_sec = interleaved({"reference": reference.step}, 2 if not big else 1)["reference"]
            ref = f" {fmt(tokens / ref_sec)} |"
            del reference
        auto_bf16 = models["auto"].low_precision_weights()
        auto_picks = "none" if not auto_bf16 else (
            "all" if len(auto_bf16) == len(models["bf16"].low_precision_weights()) else
            f"{len(auto_bf16)} of {len(models['bf16'].low_precision_weights())}")
        builtin = "" if args.no_builtin else (f" {fmt(tokens / sec['builtin'])} | "
                                              f"{sec['builtin'] / sec['ours']:.2f}x |")
        train_rows.append(f"| {s.describe()} | {fmt(tokens / sec['ours'])} | {fmt(tokens / sec['bf16'])} | "
                          f"**{sec['ours'] / sec['bf16']:.2f}x** | {fmt(tokens / sec['auto'])} ({auto_picks}) | "
                          f"**{sec['ours'] / sec['auto']:.2f}x** |{builtin}{ref}")
        print(train_rows[-1] + f"  ({steps} steps each, {time.perf_counter() - t0:.0f} s, load {load_average()})",
              file=sys.stderr, flush=True)

        if not args.no_sampling:
            t0 = time.perf_counter()
            cells = []
            for batch in (1, 64):
                fns = {}
                for kind in ("ours", "builtin"):
                    models.setdefault(kind, build(kind, s, device))
                    for length in lengths:
                        fns[(kind, length)] = (lambda m=models[kind], b=batch, n=length:
                                               sample_seconds(m, s, b, n, device))
                for kind in ("ours", "builtin"):  # warm-up: a few tokens, not a whole run
                    sample_seconds(models[kind], s, batch, 4, device)
                med = interleaved(fns, args.sample_repeats if not big else max(1, args.sample_repeats - 1), warmup=0)
                for kind in ("ours", "builtin"):
                    cells.append(" / ".join(fmt(batch * n / med[(kind, n)]) for n in lengths))
            sample_rows.append(f"| {s.describe()} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
            print(sample_rows[-1] + f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        del models, trainers

    print(f"load average at the end: {load_average()}; total {time.perf_counter() - started:.0f} s\n")
    print("## Training throughput (tokens/s)\n")
    header = ("| model | ours fp32 | ours bf16 (always) | bf16 / fp32 | ours auto (bf16 weights) | auto / fp32 |"
              + ("" if args.no_builtin else " nn.GRU / nn.LSTM / nn.RNN fp32 | ours fp32 / built-in |"))
    rule = "|---|---:|---:|---:|---:|---:|" + ("" if args.no_builtin else "---:|---:|")
    if args.reference:
        header, rule = header + " reference (per-step cells) |", rule + "---:|"
    print(header)
    print(rule)
    print("\n".join(train_rows))
    if sample_rows:
        a, b = lengths
        print(f"\n## Stateful sampling, float32 (tokens/s, generating {a} / {b} tokens)\n")
        print("| model | ours, batch 1 | built-in, batch 1 | ours, batch 64 | built-in, batch 64 |")
        print("|---|---:|---:|---:|---:|")
        print("\n".join(sample_rows))


if __name__ == "__main__":
    main()
