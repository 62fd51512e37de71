"""The end-of-run evaluation's cost against the full recipe's training time, per model (a benchmark).

    python benchmarks/bench_evaluation.py [--models astra_gamma leviathan] [--fraction 0.1] [--steps 4]
                                          [--precision auto|always|never] [--data-dir DIR]

--fraction 1 measures the whole evaluation (final weights and the best checkpoint's pass), nothing
extrapolated.

In one process, side by side: training steps of the model's recipe shape (batch 64 x 128,
forward, backward, AdamW; random weights: speed does not depend on them), median of the steps
after the first, times the recipe's steps = the full recipe's training time (extrapolated from the
measured steps); and `evaluation.evaluate` with the model's default evaluation settings
(`evaluation.max_tokens` from its config) on the first `--fraction` of the real validation split,
the budget scaled alike so the stride is the full split's, plus the best checkpoint's pass
(evaluate without the curve: the end-of-run evaluation's worst case, a best checkpoint that is not
the final one), both divided by `--fraction` = the whole evaluation (extrapolated from a measured
stretch: its cost is linear in the targets at a fixed stride). The samples (a few hundred tokens) are
left out. Ratio = evaluation / training: the goal is at most ~10% (issue 20).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gru_experiments.data.corpus import prepare_corpus
from gru_experiments.runs.estimate import planned_forward_tokens
from gru_experiments.study.scores import Split
from gru_experiments.study.evaluation import evaluate
from gru_experiments.models.protocol import build_model
from gru_experiments.models.precision import resolve

REPO = Path(__file__).resolve().parents[1]


def measure(name: str, args) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        overrides = [f"model={name}", "logger=none", f"paths.root_dir={REPO}"]
        if args.data_dir:
            overrides.append(f"paths.data_dir={args.data_dir}")
        cfg = compose("train", overrides=overrides)
    corpus = prepare_corpus(cfg.data, cfg.tokenizer, Path(cfg.paths.data_dir) / "tokenizers")
    torch.manual_seed(0)
    model = build_model(OmegaConf.to_container(cfg.model.architecture, resolve=True), corpus.tokenizer.vocab_size)
    model.set_matmul_precision(resolve(args.precision, None, "cpu"))
    batch, seq_len = cfg.data.batch_size, cfg.data.seq_len
    recipe_steps = cfg.model.epochs * cfg.model.steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    times = []
    model.train()
    for _ in range(args.steps):
        starts = torch.randint(corpus.train_ids.numel() - seq_len - 1, (batch,), generator=g)
        x = corpus.train_ids[starts.unsqueeze(1) + torch.arange(seq_len + 1)]
        started = time.perf_counter()
        logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    step = statistics.median(times[1:])
    train_seconds = step * recipe_steps

    val_all = Split.of(corpus.val_ids, corpus.tokenizer)
    n = val_all.n_targets
    part = max(int(n * args.fraction), 2 * seq_len)
    val = Split.of(corpus.val_ids[:part + 1], corpus.tokenizer)
    settings = OmegaConf.to_container(cfg.evaluation, resolve=True)
    budget = settings.get("max_tokens")
    if budget and part < n:  # the same stride on the slice as on the whole split
        settings["max_tokens"] = max(1, math.floor(part / math.ceil(n / budget)))
    training_tokens = recipe_steps * batch * seq_len
    settings["windowed_stride"] = max(1, math.ceil(n * seq_len / training_tokens)) \
        if settings.get("windowed_stride", "auto") == "auto" else settings["windowed_stride"]
    settings = OmegaConf.create(settings)
    started = time.perf_counter()
    final = evaluate(model, corpus.train_ids, val, seq_len, settings, training_tokens)
    final_seconds = time.perf_counter() - started
    started = time.perf_counter()
    evaluate(model, corpus.train_ids, val, seq_len, settings, training_tokens, curve=False)
    best_seconds = time.perf_counter() - started
    scale = n / part
    eval_seconds = (final_seconds + best_seconds) * scale
    return {"model": name, "precision": args.precision, "step": step, "tokens_per_second": batch * seq_len / step,
            "recipe_steps": recipe_steps, "train_seconds": train_seconds, "max_tokens": budget,
            "split_targets": n, "windowed_targets_slice": final.settings["windowed_targets"], "slice_targets": part,
            "eval_final_seconds": final_seconds * scale, "eval_seconds": eval_seconds,
            "planned_forward_tokens": planned_forward_tokens(model, n, seq_len, cfg.evaluation, training_tokens),
            "ratio": eval_seconds / train_seconds}


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["astra_gamma", "leviathan"])
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--precision", default="auto", choices=["auto", "always", "never"])
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    print(f"torch threads {torch.get_num_threads()}; precision {args.precision}", flush=True)
    evaluation = "measured whole" if args.fraction >= 1 else f"extrapolated from {args.fraction:.0%} of the split"
    print("| model | training tokens/s | full recipe, training (extrapolated) | max_tokens | end-of-run evaluation "
          f"({evaluation}; final + best) | evaluation / training |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for name in args.models:
        r = measure(name, args)
        print(f"| {name} | {r['tokens_per_second']:,.0f} | {hours(r['train_seconds'])} ({r['recipe_steps']:,} steps "
              f"x {r['step']:.2f} s) | {r['max_tokens'] or 'null'} | {hours(r['eval_seconds'])} "
              f"({hours(r['eval_final_seconds'])} + best; {r['planned_forward_tokens'] / 1e6:.1f}M forward tokens) "
              f"| **{100 * r['ratio']:.1f}%** |", flush=True)


if __name__ == "__main__":
    main()
