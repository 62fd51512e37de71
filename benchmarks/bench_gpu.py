"""The big models' training step on a GPU: the project's eager step, the same step replayed from a CUDA graph
(cuda_graphs=true, models/cuda_graphs.py), and cuDNN's nn.GRU / nn.LSTM of the same shape with the same
embedding, dropout, LayerNorm and head, in one run; with torch.profiler's summed kernel time against the wall
time of a step (docs/performance.md, *CUDA graphs*).

    python benchmarks/bench_gpu.py                                 # astra_gamma scribe_gamma leviathan
    python benchmarks/bench_gpu.py --models astra_alpha --steps 20
    python benchmarks/bench_gpu.py --inference                     # the evaluation's passes and the sampler
    python benchmarks/bench_gpu.py --device cpu --quick            # the plumbing on a CPU (a smoke run)

Each model at its training shape (data.batch_size x data.seq_len, 64 x 128), its dropout, and its precision
under low_precision_matmuls=auto (bf16 matmul inputs for the big weights where the device multiplies bf16
natively; cuDNN runs under bf16 autocast then). AdamW and clipping at 1.0, as the recipe. Tokens/s: the median
of --repeats timings of --steps steps each, after warmup, the modes interleaved.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_recurrence import Parser, device_arg, model_config, positive_int, trained_model  # noqa: E402

from gru_experiments.models.cuda_graphs import GraphedTrainingStep, cuda_graphs  # noqa: E402
from gru_experiments.models.precision import resolve  # noqa: E402
from gru_experiments.models.protocol import build_model, count_parameters  # noqa: E402

MODES = ("eager", "graphed", "cudnn")


class CudnnLM(nn.Module):
    """nn.GRU / nn.LSTM (cuDNN on a GPU) between the same embedding, dropout, LayerNorm and head."""

    def __init__(self, vocab: int, cell: str, embedding_dim: int, hidden_size: int, num_layers: int,
                 dropout: float, layer_norm: bool = False, **_):
        super().__init__()
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.embedding = nn.Embedding(vocab, embedding_dim)
        self.rnn = rnn(embedding_dim, hidden_size, num_layers, batch_first=True, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(hidden_size) if layer_norm else nn.Identity()
        self.head = nn.Linear(hidden_size, vocab)

    def forward(self, tokens):
        y, _ = self.rnn(self.embedding(tokens))
        return self.head(self.norm(self.dropout(y))), None


def make_step(mode: str, cfg, vocab: int, device: torch.device):
    """A function doing one training step (forward, backward, clipping, AdamW) and returning its loss."""
    torch.manual_seed(0)
    architecture = OmegaConf.to_container(cfg.model.architecture, resolve=True)
    precision = resolve("auto", None, device)
    if mode == "cudnn":
        model = CudnnLM(vocab, **{k: v for k, v in architecture.items() if k != "_target_"}).to(device)
    else:
        model = build_model(architecture, vocab).to(device)
        model.set_matmul_precision(precision)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg.model.lr))
    autocast = mode == "cudnn" and precision is not None

    def loss_fn(inputs, targets, state=None):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits, state = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)), state

    graphed = GraphedTrainingStep(loss_fn, model.parameters(), say=lambda line: None) if mode == "graphed" else None

    def step(inputs, targets):
        if graphed is not None:
            loss, _ = graphed(inputs, targets)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss, _ = loss_fn(inputs, targets)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss
    step.model, step.graphed, step.precision = model, graphed, precision
    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, batches, device) -> float:
    sync(device)
    started = time.perf_counter()
    for inputs, targets in batches:
        step(inputs, targets)
    sync(device)
    return time.perf_counter() - started


def kernel_share(step, batches, device) -> tuple[float, float]:
    """(summed kernel time per step, wall time per step) in ms, from torch.profiler over `batches`."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for inputs, targets in batches:
            step(inputs, targets)
        sync(device)
        wall = time.perf_counter() - started
    # Every device-side event (kernels, memcpy, memset), graph replays' kernels included: their summed duration.
    kernels = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type.name == "CUDA") / 1e3
    return kernels / len(batches), wall * 1e3 / len(batches)


def inference(model_name: str, cfg, vocab: int, device, quick: bool) -> None:
    """The evaluation's launch-bound parts, eager and replayed from graphs (cuda_graphs), on random tokens: the
    stateful pass over a validation-sized split (64 streams, chunks of the window), the windowed pass (a window
    per target) over a tenth of it, and the stateful sampler (12 samples of 300 tokens, a token a step)."""
    from gru_experiments.study.generation import sample_tokens
    from gru_experiments.study.scores import Split, score_stateful, score_windowed
    torch.manual_seed(0)
    model = build_model(OmegaConf.to_container(cfg.model.architecture, resolve=True), vocab).to(device)
    model.set_matmul_precision(resolve("auto", None, device))
    n, window = (2_000, 16) if quick else (111_539, int(cfg.data.seq_len))
    ids = torch.randint(vocab, (n,), device=device)
    split, small = (Split(t, torch.ones(vocab, dtype=torch.long, device=device)) for t in (ids, ids[: n // 10]))
    prompt = torch.randint(vocab, (12, 8), device=device)
    parts = {"stateful pass": lambda: score_stateful(model, split, window, 64).nll,
             "windowed pass": lambda: score_windowed(model, small, window).nll,
             "sampler": lambda: sample_tokens(model, prompt, 30 if quick else 300, "stateful",
                                              lambda logits: logits.argmax(-1))}
    for part, run in parts.items():
        seconds, results = {}, {}
        for graphs in (False, True, True):  # graphed twice: the first run sees each shape (and captures)
            with cuda_graphs(graphs):
                sync(device)
                started = time.perf_counter()
                results[graphs] = run()
                sync(device)
                seconds[graphs] = time.perf_counter() - started
        same = (torch.equal(results[False], results[True]) if isinstance(results[True], torch.Tensor)
                else abs(results[False] - results[True]) <= 1e-6 * abs(results[False]))
        print(f"{model_name:13s} {part:14s} eager {seconds[False]:7.2f} s, graphed {seconds[True]:7.2f} s "
              f"({seconds[False] / seconds[True]:.1f}x), same result: {same}", flush=True)


def arguments(argv=None) -> argparse.Namespace:
    """The command line; a value the benchmark cannot use is refused in one line (Parser)."""
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", type=trained_model, default=["astra_gamma", "scribe_gamma", "leviathan"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--steps", type=positive_int, default=30, help="steps per timing (default 30)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timings per mode, interleaved (default 3)")
    parser.add_argument("--device", type=device_arg, default="cuda")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, 1 repeat, batch 4 x 16")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--inference", action="store_true", help="the evaluation's passes and the sampler instead")
    args = parser.parse_args(argv)
    if "cudnn" in args.modes and not args.inference:  # nn.GRU / nn.LSTM of the model's shape
        for name in args.models:
            if model_config(name).model.architecture.get("cell") not in ("gru", "lstm"):
                parser.error(f"argument --models: {name} is no GRU or LSTM of RecurrentLM's shape, which the cudnn "
                             "mode builds as nn.GRU / nn.LSTM: leave it out with --modes eager graphed")
    if args.quick:
        args.steps, args.repeats = 2, 1
    return args


def main(argv=None) -> int:
    args = arguments(argv)
    device = args.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"bench_gpu: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    rows = []
    for model_name in args.models:
        cfg = model_config(model_name)
        batch, seq_len = (4, 16) if args.quick else (cfg.data.batch_size, cfg.data.seq_len)
        vocab = int(cfg.tokenizer.vocab_size) if cfg.tokenizer.kind == "spm" else 65
        if args.inference:
            inference(model_name, cfg, vocab, device, args.quick)
            continue
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(vocab, (args.steps, batch, seq_len + 1), generator=generator).to(device)
        batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
        steps = {mode: make_step(mode, cfg, vocab, device) for mode in args.modes}
        for step in steps.values():  # warmup: the graphed step captures here
            for inputs, targets in batches[:5]:
                step(inputs, targets)
        seconds = {mode: [] for mode in steps}
        for _ in range(args.repeats):
            for mode, step in steps.items():
                seconds[mode].append(timed(step, batches, device))
        tokens_per_step = batch * seq_len
        for mode, step in steps.items():
            per_step = statistics.median(seconds[mode]) / args.steps
            row = {"model": model_name, "mode": mode, "parameters": count_parameters(step.model),
                   "ms_per_step": per_step * 1e3, "tokens_per_second": tokens_per_step / per_step,
                   "precision": "bf16" if step.precision is not None else "fp32"}
            if step.graphed is not None:
                row["captured"] = step.graphed.captured if step.graphed.failed is None else step.graphed.failed
            if args.profile:
                row["kernel_ms"], row["wall_ms"] = kernel_share(step, batches[: min(5, len(batches))], device)
            rows.append(row)
            share = (f", kernels {row['kernel_ms']:.1f} of {row['wall_ms']:.1f} ms a step "
                     f"({row['kernel_ms'] / row['wall_ms']:.0%})" if args.profile else "")
            print(f"{model_name:13s} {mode:8s} {row['parameters']:>11,} params {row['precision']}: "
                  f"{row['ms_per_step']:7.2f} ms/step, {row['tokens_per_second']:>10,.0f} tokens/s{share}"
                  + (f" [captured: {row['captured']}]" if "captured" in row else ""), flush=True)
        by_mode = {r["mode"]: r["tokens_per_second"] for r in rows if r["model"] == model_name}
        if "eager" in by_mode and "graphed" in by_mode:
            print(f"{model_name}: graphed / eager {by_mode['graphed'] / by_mode['eager']:.2f}x"
                  + (f", cudnn / graphed {by_mode['cudnn'] / by_mode['graphed']:.2f}x" if "cudnn" in by_mode else ""),
                  flush=True)
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
