"""The transformer's first 150 steps: validation bits per character by learning rate, head tying and
shape at Astra-α's size (a measurement script, not a test; docs/transformer.md has its figures).

    python benchmarks/transformer_early_lr.py LAYERS,WIDTH,HEADS,LR,WARMUP,TIED,SPAN [...]
    python benchmarks/transformer_early_lr.py 4,40,2,3e-3,0,0,2000 4,40,2,6e-3,0,0,2000
    python benchmarks/transformer_early_lr.py --quick   # a smoke run: 2 steps, 2 validation windows

A lighter loop than train.py's, to compare many settings in seconds each: 150 AdamW steps (weight
decay 0.01) on 64 random windows of 128 characters of the shipped corpus (first 90%), the learning
rate on a cosine over SPAN steps (150: it ends at 0, as `trainer.max_steps=150`; 2000: the first 150
steps of the full recipe's schedule), after WARMUP linear steps; then the validation split (last
10%) in chunks of 128 from a zero state, as train.py's val_bpc. One thread. TIED=0 gives the head
its own weights (tie_head: false).
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus
from gru_experiments.models.transformer import TransformerLM

STEPS, BATCH, WINDOW = 150, 64, 128


def run(train, val, vocab, layers, width, heads, lr, warmup=0, tied=True, span=None, seed=1234, steps=STEPS) -> str:
    torch.manual_seed(seed)
    model = TransformerLM(vocab, block_size=WINDOW, embedding_dim=width, num_layers=layers, num_heads=heads,
                          dropout=0.0, bias=False, tie_head=tied)
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    started = time.time()
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * step / (span or STEPS)))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        starts = torch.randint(0, len(train) - WINDOW - 1, (BATCH,), generator=generator)
        x = torch.stack([train[s:s + WINDOW] for s in starts])
        y = torch.stack([train[s + 1:s + WINDOW + 1] for s in starts])
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        v = val[: (len(val) - 1) // WINDOW * WINDOW + 1]
        x, y = v[:-1].view(-1, WINDOW), v[1:].view(-1, WINDOW)
        for i in range(0, len(x), 256):
            logits, _ = model(x[i:i + 256])
            total += F.cross_entropy(logits.reshape(-1, vocab), y[i:i + 256].reshape(-1), reduction="sum").item()
            count += y[i:i + 256].numel()
    return (f"layers {layers}, width {width}, heads {heads}, lr {lr:g}, warmup {warmup}, tied {tied}, "
            f"cosine over {span or STEPS}: {parameters:,} parameters, validation bpc {total / count / math.log(2):.4f} "
            f"({time.time() - started:.0f} s)")


def main(specs: list[str]) -> None:
    quick = "--quick" in specs  # a smoke run: 2 steps of batch 64, 2 validation windows
    specs = [spec for spec in specs if spec != "--quick"] or ["4,40,2,3e-3,0,0,2000"]
    torch.set_num_threads(1)
    text = read_corpus(SHIPPED_CORPUS)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text])
    cut = int(len(ids) * 0.9)
    for spec in specs:
        layers, width, heads, lr, warmup, tied, span = spec.split(",")
        val = ids[cut:cut + 2 * WINDOW + 1] if quick else ids[cut:]
        print(run(ids[:cut], val, len(chars), int(layers), int(width), int(heads), float(lr), int(warmup),
                  tied == "1", int(span) or None, steps=2 if quick else STEPS), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
