"""What the cache figure (study/cache.py) adds to a run's evaluation: the stateful pass with and without its states
kept, and the cache's fit and figures, on Tiny Shakespeare's validation split (111,539 targets, 64 streams), at
Astra-α's and Astra-γ's sizes (untrained weights: the cost does not depend on them).

    OMP_NUM_THREADS=1 python benchmarks/bench_cache.py [--device cuda] [--models astra_alpha astra_gamma]
"""

import argparse
import time

import torch

from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.cache import cache_figures
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["astra_alpha", "astra_gamma"])
    args = parser.parse_args()
    device = torch.device(args.device)
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = CharTokenizer(sorted(set(text)))
    _, val_text = split_text(text, 0.9)
    split = Split(torch.tensor(tokenizer.encode(val_text)), tokenizer.token_char_lengths).to(device)
    for name in args.models:
        model = RecurrentLM(tokenizer.vocab_size, "gru", **SIZES[name]).to(device).eval()
        run = lambda keep: score_stateful(model, split, 128, 64, targets_after=128, keep_states=keep)  # noqa: E731
        run(False)  # warm-up
        _, plain = timed(lambda: run(False), device)
        kept, with_states = timed(lambda: run(True), device)
        figures, cache = timed(lambda: cache_figures(kept.states, split, 128), device)
        longest = figures.record["longest"]
        print(f"{name} on {device}: stateful pass {plain:.2f} s, with its states kept {with_states:.2f} s; the cache "
              f"(N = 128..{longest}, {len(figures.record['sizes'])} sizes) {cache:.2f} s; states "
              f"{kept.states.hidden.numel() * 2 / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
