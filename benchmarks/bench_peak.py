"""Training throughput as a fraction of this machine's own matmul peak, fp32 and bf16, measured in one run.

    python benchmarks/bench_peak.py                               # Astra-γ and Scribe-β (the scale study's big two)
    python benchmarks/bench_peak.py --models astra_alpha,astra_beta,astra_gamma,scribe_alpha,scribe_beta
    python benchmarks/bench_peak.py --quick                       # a smoke run: Astra-α, small matmuls, 1 step

The peak is the best GFLOP/s of torch.mm over a few large shapes (the batch's input projection, 8192 x 512 x 1536,
and a square 2048), fp32 and bf16 inputs (fp32 accumulation). A model's training FLOPs per token count its matmuls
only (the input projections, the hidden-side matmuls of every step and the head): 2 per multiply-add forward, and
twice that again backward (the input's gradient and the weight's), so 6 x the multiply-adds per token. The gates'
element-wise work, the embedding and AdamW are left out, so the fraction is an upper bound on the matmul share.
Training runs as bench_recurrence.py's (forward, cross-entropy, backward, AdamW on a fixed random batch of 64 x 128),
in fp32 and as `low_precision_matmuls=auto` picks here, interleaved; medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_recurrence import Parser, Trainer, build, interleaved, load_shapes, machine_info, positive_int

from gru_experiments.models.precision import has_fast_bf16

PEAK_SHAPES = [(8192, 512, 1536), (2048, 2048, 2048)]
QUICK_SHAPES = [(1024, 256, 768)]


def cpu_flags() -> str:
    """The CPU's vector and matrix flags that decide matmul speed (avx*, amx*, fma), from /proc/cpuinfo."""
    try:
        line = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of an (m x k) @ (k x n) product with `dtype` inputs: the median of `repeats` after a warm-up."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - started)
    return 2 * m * k * n / statistics.median(seconds) / 1e9


def training_flops_per_token(shape) -> float:
    """6 x the multiply-adds of a token's matmuls: every layer's input and hidden side, and the head."""
    gates = {"gru": 3, "lstm": 4, "rnn": 1}[shape.cell]
    macs, inputs = 0, shape.embedding_dim
    for _ in range(shape.num_layers):
        macs += (inputs + shape.hidden_size) * gates * shape.hidden_size
        inputs = shape.hidden_size
    return 6.0 * (macs + shape.hidden_size * shape.vocab_size)


def main(argv=None) -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated (default astra_gamma,scribe_beta; "
                                                   "--quick astra_alpha)")
    p.add_argument("--steps", type=positive_int, default=None, help="timed training steps per precision (5; --quick 1)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="a smoke run: one small peak shape, few repetitions, Astra-α")
    args = p.parse_args(argv)
    args.models = args.models or ("astra_alpha" if args.quick else "astra_gamma,scribe_beta")
    args.steps = args.steps or (1 if args.quick else 5)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    shapes = load_shapes(args.models.split(","))
    unknown = [name for name in args.models.split(",") if name not in shapes]
    if unknown:
        p.error(f"--models: unknown or not a GRU/LSTM/RNN config: {unknown}; known: {sorted(load_shapes())}")

    print("## Machine\n")
    print(machine_info(device))
    print(f"- CPU flags: {cpu_flags()}")
    print(f"- fast bf16 (avx512_bf16 or amx_bf16; what low_precision_matmuls=auto looks for): {has_fast_bf16(device)}")
    repeats = 3 if args.quick else 10
    peak = {}
    print("\n## Matmul peak (torch.mm, GFLOP/s, median)\n\n| m x k x n | fp32 | bf16 |\n|---|--:|--:|")
    for m, k, n in QUICK_SHAPES if args.quick else PEAK_SHAPES:
        row = {dtype: matmul_gflops(m, k, n, dtype, repeats) for dtype in (torch.float32, torch.bfloat16)}
        for dtype, value in row.items():
            peak[dtype] = max(peak.get(dtype, 0.0), value)
        print(f"| {m} x {k} x {n} | {row[torch.float32]:,.1f} | {row[torch.bfloat16]:,.1f} |", flush=True)
    print(f"\npeak: fp32 {peak[torch.float32]:,.1f}, bf16 {peak[torch.bfloat16]:,.1f} GFLOP/s")

    print("\n## Training (batch 64 x 128; matmul GFLOP/s and the fraction of each peak)\n")
    print("| model | GFLOP per token | precision | tokens/s | GFLOP/s | of fp32 peak | of bf16 peak |")
    print("|---|--:|---|--:|--:|--:|--:|")
    for name in args.models.split(","):
        shape = shapes[name]
        trainers = {kind: Trainer(build(kind, shape, device), shape, 64, 128, device) for kind in ("ours", "auto")}
        seconds = interleaved({kind: trainer.step for kind, trainer in trainers.items()}, args.steps)
        flops = training_flops_per_token(shape)
        for kind, label in (("ours", "fp32"), ("auto", "auto")):
            tokens = 64 * 128 / seconds[kind]
            achieved = tokens * flops / 1e9
            print(f"| {name} | {flops / 1e9:.4f} | {label} | {tokens:,.0f} | {achieved:,.1f} | "
                  f"{achieved / peak[torch.float32]:.0%} | {achieved / peak[torch.bfloat16]:.0%} |", flush=True)


if __name__ == "__main__":
    main()
