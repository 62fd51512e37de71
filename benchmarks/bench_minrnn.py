"""minGRU and minLSTM against Astra-α's GRU at the same size: training tokens/s by window, and the parallel
scan against the same cell run step by step.

    python benchmarks/bench_minrnn.py                     # windows 128 and 512, scan cost up to 2,048
    python benchmarks/bench_minrnn.py --quick             # a smoke run (window 16, scans of 8 and 16 steps)
    python benchmarks/bench_minrnn.py --device cuda       # the same on a GPU (each step synchronised)

Training: one step = forward, cross-entropy, backward and AdamW on a fixed random batch (64 windows, 65 symbols),
the models built from conf/model/{astra_alpha,mingru,minlstm}.yaml; the GRU runs its fast path, the minimal
cells their scan, and the minimal cells once more as a loop over their readable `step` (what training would cost
without the scan). Interleaved repetitions, medians. Scan cost: one layer of the α size (109 wide), forward and
backward, microseconds per token (batch 64), as the window grows.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_recurrence import REPO, Parser, device_arg, int_list, interleaved, machine_info, positive_int, sync
from omegaconf import OmegaConf

from gru_experiments.models.minrnn import MinRNNLayer
from gru_experiments.models.protocol import build_model

MODELS = ("astra_alpha", "mingru", "minlstm")


class SequentialLayers(torch.nn.Module):
    """A minimal model's layers run step by step (MinRNNLayer.sequential) instead of the scan: the baseline."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        for layer in model.layers:
            layer.scan = layer.sequential

    def forward(self, tokens):
        return self.model(tokens)


def built(name: str, device):
    architecture = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml").architecture)
    return build_model(architecture, 65).to(device)


def train_step(model, tokens: torch.Tensor, optimizer):
    def step() -> float:
        sync(tokens.device)
        started = time.perf_counter()
        logits, _ = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 65), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(tokens.device)
        return time.perf_counter() - started
    return step


def scan_microseconds(length: int, repeats: int, device) -> dict[str, float]:
    """Forward + backward of one 109-wide minGRU layer over `length` steps, µs per token, scan and loop."""
    layer = MinRNNLayer("mingru", 109, 109).to(device)
    x = torch.randn(64, length, 109, device=device, requires_grad=True)
    h0 = torch.zeros(64, 109, device=device)

    def timed(run):
        def once() -> float:
            sync(device)
            started = time.perf_counter()
            run(x, h0)[0].sum().backward()
            sync(device)
            return time.perf_counter() - started
        return once
    seconds = interleaved({"scan": timed(layer.scan), "loop": timed(layer.sequential)}, repeats)
    return {kind: value / (64 * length) * 1e6 for kind, value in seconds.items()}


def main(argv=None) -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int_list, default="128,512")
    p.add_argument("--scan-lengths", type=int_list, default="32,128,512,2048")
    p.add_argument("--steps", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--quick", action="store_true", help="a smoke run: window 16, scans of 8 and 16 steps, 1 step")
    args = p.parse_args(argv)
    if args.quick:
        args.windows, args.scan_lengths, args.steps = [16], [8, 16], 1
    device = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("## Machine\n")
    print(machine_info(device))
    print("\n## Training, batch 64 (tokens/s, medians of interleaved steps)\n")
    print("| window | " + " | ".join(MODELS) + " | mingru, step loop | minlstm, step loop |")
    print("|--:|" + "--:|" * (len(MODELS) + 2))
    for window in args.windows:
        tokens = torch.randint(0, 65, (64, window + 1), device=device)
        steps = {}
        for name in MODELS:
            model = built(name, device).train()
            steps[name] = train_step(model, tokens, torch.optim.AdamW(model.parameters(), lr=1e-3))
        for name in MODELS[1:]:
            loop = SequentialLayers(built(name, device).train())
            steps[f"{name} loop"] = train_step(loop, tokens, torch.optim.AdamW(loop.parameters(), lr=1e-3))
        seconds = interleaved(steps, args.steps)
        print(f"| {window} | " + " | ".join(f"{64 * window / seconds[name]:,.0f}" for name in steps) + " |",
              flush=True)
    print("\n## One minGRU layer (109 wide, batch 64), forward + backward: µs per token\n")
    print("| steps | scan | step loop | loop / scan |\n|--:|--:|--:|--:|")
    for length in args.scan_lengths:
        cost = scan_microseconds(length, args.steps, device)
        print(f"| {length} | {cost['scan']:.2f} | {cost['loop']:.2f} | {cost['loop'] / cost['scan']:.1f}x |",
              flush=True)


if __name__ == "__main__":
    main()
