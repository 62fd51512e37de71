"""Training speed of training=windows against training=streams, side by side in one process (a
benchmark, not a test).

    python benchmarks/bench_batching.py [--model astra_alpha] [--steps 40] [--rounds 5] [--threads 1]
    python benchmarks/bench_batching.py --quick   # a smoke run (2 steps, 1 round, 4 x 16 batches)

Both modes train the same model (the config's architecture, AdamW, 64 x 128 batches of the shipped
corpus) through LanguageModelTask.training_step, the code train.py runs; rounds alternate the
order (windows first, then streams first, ...) so that a change in the machine's load falls on
both. Prints tokens/s per round and the median ratio streams / windows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_recurrence import Parser, machine_info, model_config, positive_int, trained_model
from omegaconf import OmegaConf

from gru_experiments.data.batches import RandomWindowBatches, StreamBatches
from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus
from gru_experiments.data.tokenizers import build_tokenizer
from gru_experiments.runs.task import LanguageModelTask


def architecture(name: str) -> dict:
    return OmegaConf.to_container(model_config(name).model.architecture, resolve=True)


def trainer_free_task(name: str, vocab_size: int) -> tuple[LanguageModelTask, torch.optim.Optimizer]:
    torch.manual_seed(0)
    task = LanguageModelTask(architecture(name), vocab_size)
    task.log = lambda *args, **kwargs: None  # no Trainer here: logging is a no-op
    optimizer = torch.optim.AdamW(task.parameters(), lr=1e-3, weight_decay=0.01)
    task.optimizers = lambda: optimizer
    return task.train(), optimizer


def time_steps(task, optimizer, batches, steps: int) -> float:
    """Tokens per second over `steps` training steps (forward, backward, clip, update)."""
    iterator = iter(batches)
    tokens, started = 0, time.perf_counter()
    for i in range(steps):
        batch = next(iterator)
        loss = task.training_step(batch, i)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.parameters(), 1.0)
        optimizer.step()
        tokens += batch[0].numel()
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=trained_model, default="astra_alpha")
    parser.add_argument("--steps", type=positive_int, default=40, help="training steps per mode per round")
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--seq-len", type=positive_int, default=128)
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, 1 round, 4 x 16 batches")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.batch, args.seq_len = 2, 1, 4, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = build_tokenizer("char", text, None)
    ids = torch.tensor(tokenizer.encode(text[: int(len(text) * 0.9)]), dtype=torch.long)
    loaders = {
        "windows": RandomWindowBatches(ids, args.batch, args.seq_len, 10**9, torch.Generator().manual_seed(0)),
        "streams": StreamBatches(ids, args.batch, args.seq_len, 10**9, seed=0),
    }
    tasks = {mode: trainer_free_task(args.model, tokenizer.vocab_size) for mode in loaders}
    for mode in loaders:  # warm-up
        time_steps(*tasks[mode], loaders[mode], 3)
    speeds = {mode: [] for mode in loaders}
    for round_ in range(args.rounds):
        for mode in (list(loaders) if round_ % 2 == 0 else list(reversed(loaders))):
            speeds[mode].append(time_steps(*tasks[mode], loaders[mode], args.steps))
    print(f"# {args.model}: training tokens/s, {args.batch} x {args.seq_len} batches, {args.steps} steps per mode "
          f"per round\n{machine_info(torch.device('cpu'))}")
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in Path("/proc/cpuinfo").read_text()]
    print(f"- CPU flags of note: {', '.join(flags) or 'none'}")
    for mode, values in speeds.items():
        print(f"{mode:>8}: " + "  ".join(f"{v:,.0f}" for v in values) + f"   median {statistics.median(values):,.0f}")
    ratios = [s / w for s, w in zip(speeds["streams"], speeds["windows"])]
    print(f"streams / windows per round: {'  '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
