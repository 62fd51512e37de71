"""What dynamic evaluation (study/dynamic.py) costs beside the stateful pass it extends, side by side in one run:
tokens per second and peak memory, on Tiny Shakespeare's validation split, at Astra-α's and Astra-β's sizes (untrained
weights: the cost does not depend on them). Two layouts: the run's evaluation (64 streams side by side) and the study
tool's (one stream, the document in order, on the split's first --one-stream-targets targets).

    OMP_NUM_THREADS=1 python benchmarks/bench_dynamic.py [--device cuda] [--models astra_alpha astra_beta]
    python benchmarks/bench_dynamic.py --quick        # a smoke run: Astra-α on the split's first 3,000 targets

Each measurement runs in a fresh process, so that its peak memory is its own: on a CPU the growth of the process's
peak resident set (ru_maxrss) over the pass, on a GPU torch.cuda.max_memory_allocated over the pass. Dynamic: sgd,
segment 32 (rms's step costs the same; its statistics, gathered once on the training split, are not in the time).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_recurrence import Parser, device_arg, machine_info, positive_int

from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.dynamic import DynamicSettings, score_dynamic
from gru_experiments.study.evaluation import DEFAULT_EVALUATION
from gru_experiments.study.scores import Split, score_stateful

# conf/model/: the architectures (Astra-γ and Leviathan: a GPU's, --models astra_gamma leviathan)
SIZES = {"astra_alpha": dict(cell="gru", embedding_dim=64, hidden_size=128, num_layers=1),
         "astra_beta": dict(cell="gru", embedding_dim=128, hidden_size=256, num_layers=2),
         "astra_gamma": dict(cell="gru", embedding_dim=256, hidden_size=512, num_layers=3),
         "leviathan": dict(cell="lstm", embedding_dim=768, hidden_size=1024, num_layers=3, layer_norm=True)}
PASSES = ("stateful", "dynamic")


def split_of(targets: int | None, device) -> Split:
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = CharTokenizer(sorted(set(text)))
    _, val_text = split_text(text, 0.9)
    ids = torch.tensor(tokenizer.encode(val_text if targets is None else val_text[:targets + 1]))
    return Split(ids, tokenizer.token_char_lengths).to(device)


def peak_bytes(device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def measure(name: str, which: str, streams: int, targets: int | None, device) -> dict:
    """One pass in this process: (tokens/s, the peak memory it added)."""
    torch.manual_seed(0)
    split = split_of(targets, device)
    model = RecurrentLM(split.char_lengths.numel(), **SIZES[name]).to(device).eval()
    settings = DynamicSettings.of({"rule": "sgd", "lr": 0.01, "segment": 32}, DEFAULT_EVALUATION)
    warm = Split(split.ids[:257], split.char_lengths)
    score_stateful(model, warm, 128, 1)
    score_dynamic(model, warm, settings, 1)  # warm-up: the kernels, the allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    before = peak_bytes(device)
    start = time.perf_counter()
    if which == "stateful":
        score_stateful(model, split, 128, streams)
    else:
        score_dynamic(model, split, settings, streams)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"tokens_per_second": split.n_targets / seconds, "seconds": seconds, "peak_added": peak_bytes(device) -
            before, "targets": split.n_targets}


def child(args) -> dict:
    """The measurement in a fresh interpreter (its own peak)."""
    command = [sys.executable, __file__, "--child", args.child_spec]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode:
        raise SystemExit(f"error: bench_dynamic.py: a measurement failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default), cuda, auto")
    parser.add_argument("--models", nargs="+", default=["astra_alpha", "astra_beta"], choices=sorted(SIZES))
    parser.add_argument("--one-stream-targets", type=positive_int, default=20_000,
                        help="the one-stream rows' targets (the split's first)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads in each process")
    parser.add_argument("--quick", action="store_true", help="a smoke run: Astra-α on the first 3,000 targets")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        if spec["threads"]:
            torch.set_num_threads(spec["threads"])
        print(json.dumps(measure(spec["name"], spec["which"], spec["streams"], spec["targets"],
                                 torch.device(spec["device"]))))
        return
    if args.quick:
        args.models, whole, args.one_stream_targets = ["astra_alpha"], 3_000, 1_000
    else:
        whole = None
    print(machine_info(args.device))
    rows = []
    for name in args.models:
        for streams, targets in ((64, whole), (1, args.one_stream_targets)):
            found = {}
            for which in PASSES:
                args.child_spec = json.dumps({"name": name, "which": which, "streams": streams, "targets": targets,
                                              "device": str(args.device), "threads": args.threads})
                found[which] = child(args)
            rows.append((name, streams, found))
    print("\n## Dynamic evaluation against the stateful pass\n")
    print("| model | streams | targets | stateful tokens/s | dynamic tokens/s | dynamic / stateful time | "
          "stateful peak added | dynamic peak added |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, streams, f in rows:
        s, d = f["stateful"], f["dynamic"]
        print(f"| {name} | {streams} | {s['targets']:,} | {s['tokens_per_second']:,.0f} | "
              f"{d['tokens_per_second']:,.0f} | {d['seconds'] / s['seconds']:.2f}x | {_mb(s['peak_added'])} | "
              f"{_mb(d['peak_added'])} |")


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


if __name__ == "__main__":
    main()
