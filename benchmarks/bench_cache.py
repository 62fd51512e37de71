"""What the cache figure (study/cache.py) adds to a run's evaluation: the stateful pass with and without its states
kept, and the cache's fit and figures, on Tiny Shakespeare's validation split (111,539 targets, 64 streams), at
Astra-α's and Astra-γ's sizes (untrained weights: the cost does not depend on them).

    OMP_NUM_THREADS=1 python benchmarks/bench_cache.py [--device cuda] [--models astra_alpha astra_gamma]
    python benchmarks/bench_cache.py --stride 1      # every position queried (a CPU run's default: CPU_STRIDE)
    python benchmarks/bench_cache.py --quick        # a smoke run: Astra-α on the split's first 6,000 targets
"""

import argparse
import time

import torch
from bench_recurrence import Parser, device_arg

from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.cache import CPU_STRIDE, cache_figures, stateful_states
from gru_experiments.study.scores import Split, score_stateful

# conf/model/: Astra-α and Astra-γ's architectures
SIZES = {"astra_alpha": dict(embedding_dim=64, hidden_size=128, num_layers=1),
         "astra_gamma": dict(embedding_dim=256, hidden_size=512, num_layers=3)}


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device_arg, default="auto", help="auto (a GPU where there is one), cpu, cuda")
    parser.add_argument("--models", nargs="+", default=["astra_alpha", "astra_gamma"], choices=sorted(SIZES))
    parser.add_argument("--stride", type=int, default=None,
                        help="query every N-th position (default: as the evaluation, 1 on a GPU, CPU_STRIDE on a CPU)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: Astra-α on the first 6,000 targets")
    args = parser.parse_args()
    device = args.device
    if args.stride is not None and args.stride < 1:
        parser.error(f"--stride must be an integer >= 1, got {args.stride}")
    stride = args.stride or (1 if device.type == "cuda" else CPU_STRIDE)
    if args.quick:
        args.models = ["astra_alpha"]
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = CharTokenizer(sorted(set(text)))
    _, val_text = split_text(text, 0.9)
    ids = torch.tensor(tokenizer.encode(val_text[:6_001] if args.quick else val_text))
    split = Split(ids, tokenizer.token_char_lengths).to(device)
    for name in args.models:
        model = RecurrentLM(tokenizer.vocab_size, "gru", **SIZES[name]).to(device).eval()
        score_stateful(model, split, 128, 64, targets_after=128)  # warm-up
        _, plain = timed(lambda: score_stateful(model, split, 128, 64, targets_after=128), device)
        (_, kept), with_states = timed(lambda: stateful_states(model, split, 128, 64, targets_after=128), device)
        figures, cache = timed(lambda: cache_figures(kept, split, 128, stride=stride), device)
        longest = figures["longest"]
        print(f"{name} on {device}: stateful pass {plain:.2f} s, with its states kept {with_states:.2f} s; the cache "
              f"(N = 128..{longest}, {len(figures['sizes'])} sizes, every {stride} position) {cache:.2f} s; "
              "states "
              f"{kept.hidden.numel() * 2 / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
