"""Generation speed of the three inference modes (a benchmark, not a test).

    python benchmarks/bench_sampling.py [--model astra_alpha] [--lengths 100 1000] [--batch 1] [--device cpu]
    python benchmarks/bench_sampling.py --quick   # a smoke run (8 and 16 tokens)

Stateful sampling costs the same per token however long the text gets (tokens/s stays flat from
100 to 1000 tokens); windowed sampling re-runs up to `window` tokens per new token, so it slows
down until the context fills the window; stateless is one token from zero state per step.
Random weights: speed does not depend on what the model learned.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from bench_recurrence import Parser, positive_int
from omegaconf import OmegaConf

from gru_experiments.models.protocol import build_model, count_parameters
from gru_experiments.study.generation import Decoding, generate

CONF = Path(__file__).resolve().parents[1] / "conf"


def architecture(name: str) -> dict:
    config = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    model = config.get("model", config)  # the scribe_* configs keep their keys under model:
    return OmegaConf.to_container(model.architecture)


def tokens_per_second(model, mode: str, length: int, batch: int, window: int, prompt_len: int = 8) -> float:
    prompt = list(range(prompt_len))
    run = lambda n: generate(model, prompt, mode=mode, max_new_tokens=n, num_samples=batch,  # noqa: E731
                             decoding=Decoding(temperature=1.0), seed=0, window=window)
    run(5)  # warm-up
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    run(length)
    sync()
    return batch * length / (time.perf_counter() - started)


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="astra_alpha")
    parser.add_argument("--vocab", type=int, default=65, help="65: Tiny Shakespeare characters; 1000: spm")
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--batch", type=int, default=1, help="samples drawn together")
    parser.add_argument("--window", type=int, default=128, help="windowed mode's context (training seq_len)")
    parser.add_argument("--modes", nargs="+", default=["stateful", "stateless", "windowed"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 8 and 16 tokens, window 8")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.window = [8, 16], 8
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = build_model(architecture(args.model), args.vocab).to(args.device).eval()
    print(f"{args.model}: {count_parameters(model):,} parameters, batch {args.batch}, window {args.window}, "
          f"device {args.device}, {torch.get_num_threads()} CPU threads")
    print(f"{'mode':<10} {'tokens':>7} {'tokens/s':>10}")
    for mode in args.modes:
        for length in args.lengths:
            speed = tokens_per_second(model, mode, length, args.batch, args.window)
            print(f"{mode:<10} {length:>7} {speed:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
