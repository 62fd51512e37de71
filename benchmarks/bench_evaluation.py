"""The end-of-run evaluation's cost against the full recipe's training time, per model (a benchmark).

    python benchmarks/bench_evaluation.py [--models astra_gamma leviathan] [--steps 4]
                                          [--precision auto|always|never] [--data-dir DIR] [OVERRIDE ...]
    python benchmarks/bench_evaluation.py --quick data.path=FILE   # a smoke run (Astra-α, a 2-step recipe)

In one process, side by side: training steps of the model's recipe shape (batch 64 x 128,
forward, backward, AdamW; random weights: speed does not depend on them), median of the steps
after the first, times the recipe's steps = the full recipe's training time (extrapolated from the
measured steps); and the whole end-of-run evaluation as a full recipe plans it (study/plan.py, the
model's evaluation.budget of the recipe's training tokens): the final weights' plan and the best
checkpoint's (the worst case: a best checkpoint that is not the final one), measured, with the
plans' forward tokens. The samples (a few hundred tokens) are left out. Ratio = evaluation /
training: the goal is at most ~10% for the big models (issue 20).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gru_experiments.data.corpus import prepare_corpus
from gru_experiments.models.precision import resolve
from gru_experiments.models.protocol import build_model
from gru_experiments.study.evaluation import EvaluationSettings, evaluate, plan_for
from gru_experiments.study.plan import BEST, FINAL, Request
from gru_experiments.study.scores import Split

REPO = Path(__file__).resolve().parents[1]


def measure(name: str, args) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        overrides = [f"model={name}", "logger=none", f"paths.root_dir={REPO}"]
        if args.data_dir:
            overrides.append(f"paths.data_dir={args.data_dir}")
        if args.quick:  # a recipe of 2 steps at 4 x 16: the evaluation's budget in proportion
            overrides += ["model.steps_per_epoch=2", "model.epochs=1", "data.batch_size=4", "data.seq_len=16",
                          "evaluation.text.samples=0"]
        overrides += args.overrides
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
        x = corpus.train_ids[starts.unsqueeze(1) + torch.arange(seq_len + 1)].long()  # ids are stored narrow (uint8)
        started = time.perf_counter()
        logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    step = statistics.median(times[1:])
    train_seconds = step * recipe_steps

    val = Split.of(corpus.val_ids, corpus.tokenizer)
    training_tokens = recipe_steps * batch * seq_len
    seconds, forward = [], 0
    settings = EvaluationSettings.of(cfg.evaluation, seq_len)
    for purpose in (FINAL, BEST):  # the final weights (without the text statistics), then the best checkpoint
        request = Request(model, val, settings, training_tokens, purpose, train_ids=corpus.train_ids)
        plan = plan_for(request)
        started = time.perf_counter()
        evaluate(request, plan)
        seconds.append(time.perf_counter() - started)
        forward += plan.forward_tokens
    return {"model": name, "precision": args.precision, "step": step, "tokens_per_second": batch * seq_len / step,
            "recipe_steps": recipe_steps, "train_seconds": train_seconds, "budget": cfg.evaluation.budget,
            "eval_final_seconds": seconds[0], "eval_seconds": sum(seconds), "forward_tokens": forward,
            "ratio": sum(seconds) / train_seconds}


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["astra_gamma", "leviathan"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--precision", default="auto", choices=["auto", "always", "never"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: Astra-α, a 2-step recipe at 4 x 16")
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. data.path=FILE")
    args = parser.parse_args()
    if args.quick:
        args.models, args.steps = ["astra_alpha"], 2
    print(f"torch threads {torch.get_num_threads()}; precision {args.precision}", flush=True)
    print("| model | training tokens/s | full recipe, training (extrapolated) | evaluation.budget | end-of-run "
          "evaluation (measured; final + best) | evaluation / training |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for name in args.models:
        r = measure(name, args)
        print(f"| {name} | {r['tokens_per_second']:,.0f} | {hours(r['train_seconds'])} ({r['recipe_steps']:,} steps "
              f"x {r['step']:.2f} s) | {r['budget']} | {hours(r['eval_seconds'])} "
              f"({hours(r['eval_final_seconds'])} + best; {r['forward_tokens'] / 1e6:.1f}M forward tokens) "
              f"| **{100 * r['ratio']:.1f}%** |", flush=True)


if __name__ == "__main__":
    main()
