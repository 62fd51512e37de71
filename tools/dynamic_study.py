"""The dynamic-evaluation study (issue 70) over trained run folders, read only: one command.

    python tools/dynamic_study.py RUN [RUN ...] [--out DIR] [--quick] [--streams 1] [--cache-every 4] [--no-swap]
                                  [--extend EARLIER/dynamic_study.json]

RUN: a run folder, or a sweep folder (its job folders with a summary.json). The runs are grouped by model and
corpus; each group's seed-1 run (else its lowest seed) tunes η, λ and the segment on the first half of the
validation split (the grid: GRID, searched one coordinate at a time for each rule, sgd and rms; the better rule
wins), and those values serve every seed of the group. Then for every run, on the second half (every figure's
pass runs over the whole split, the state and the adaptation carried from the first half, as the cache's keys
are; each target scored before any update on it): stateful, dynamic and dynamic − stateful paired target by
target; the cache (fitted on the first half, as in every run's evaluation) over the stateful pass and over the
dynamic pass's adapted states (cache + dynamic); the gain by reach, reset_every = 128, 512, 4096 and never, beside
the cache's gain at the same N; and, for the tuning run, which parameters carry it (all, head, recurrence). The
halves swapped once (tuned on the second, reported on the first) for the tuning run, as a check. Written to --out
(default outputs/dynamic_study/<time>/): dynamic_study.json (after every run), dynamic_study.md and
gain_by_reach.png. --extend: an earlier study's groups kept as they are (their tuning, swapped check and runs), and
only the runs it did not study (seeds trained since) reported, with its tuned values. docs/evaluation.md, *Dynamic
evaluation*, says what each figure is.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REACHES = (128, 512, 4096, None)  # reset_every: the gain by reach (None: never reset)
GRID = {"lr": {"sgd": (0.003, 0.01, 0.03, 0.1), "rms": (1e-5, 3e-5, 1e-4, 3e-4)},
        "decay": (0.0, 0.001, 0.01), "segment": (16, 32, 64)}
QUICK = {"lr": {"sgd": (0.01, 0.03), "rms": (1e-5, 3e-5)}, "decay": (0.0,), "segment": (16,)}
START = {"decay": 0.0, "segment": 16}  # where each rule's search starts (its lr: the grid's second)
PARTS = ("head", "recurrence")  # beside `all`, on the tuning run


def find_runs(paths: list[str]) -> tuple[list[Path], list[str]]:
    """Run folders (with checkpoints/last.ckpt and a completed summary.json) under `paths`, and a line for each
    path that holds none."""
    found, problems = [], []
    for given in paths:
        path = Path(given).expanduser()
        candidates = [path] if (path / "summary.json").is_file() else sorted(p.parent for p in path.glob(
            "*/summary.json"))
        runs = [p for p in candidates if (p / "checkpoints" / "last.ckpt").is_file()
                and json.loads((p / "summary.json").read_text()).get("status") == "completed"]
        found += runs
        if not runs:
            problems.append(f"{given}: no completed run folder (summary.json and checkpoints/last.ckpt) there")
    return found, problems


class Study:
    """One run's model and splits, and the passes the study runs on them (one stream by default: the adaptation
    reads the document in order, so reset_every is a reach in tokens)."""

    def __init__(self, folder: Path, streams: int, cache_every: int, bar):
        import gru_experiments
        from gru_experiments.data.corpus import shipped_name
        from gru_experiments.study.scores import Split

        self.folder, self.lm, self.streams, self.every, self.bar = folder, gru_experiments.load(folder), streams, \
            cache_every, bar
        splits = self.lm.run.splits()
        self.corpus = shipped_name(splits.source)  # the text it read: a shipped corpus by its name, else the file's
        self.train_ids, self.val = splits.train_ids, Split.of(splits.val_ids, self.lm.tokenizer)
        self.window = self.lm.run.evaluation_settings().window
        self._statistics = {}

    @property
    def key(self) -> str:
        return f"{self.lm.name} on {self.corpus}"

    def settings(self, **values):
        from gru_experiments.study.dynamic import DynamicSettings
        from gru_experiments.study.evaluation import DEFAULT_EVALUATION

        return DynamicSettings.of({"reset_every": None, "params": "all"} | values, DEFAULT_EVALUATION)

    def statistics(self, s):
        from gru_experiments.study.dynamic import gradient_statistics

        if s.rule != "rms" or s.lr == 0:
            return None
        if s.segment not in self._statistics:
            self._statistics[s.segment] = gradient_statistics(self.lm.model, self.train_ids, s)
        return self._statistics[s.segment]

    def dynamic(self, split, s, read=None):
        """score_dynamic's result on `split` (None where it diverged)."""
        from gru_experiments.study.dynamic import score_dynamic

        self.bar.set_postfix_str(f"{self.folder.name}: {s.rule} η {s.lr:g} λ {s.decay:g} seg {s.segment} "
                                 f"reset {s.reset_every} {s.params}")
        result = score_dynamic(self.lm.model, split, s, self.streams, statistics=self.statistics(s), read=read)
        self.bar.update(1)
        return None if result.diverged_at is not None else result.score

    def half(self, half: str):
        from gru_experiments.runs.trained_run import validation_half
        from gru_experiments.study.scores import Split

        return Split.of(validation_half(self.val.ids, half), self.lm.tokenizer)


def tune(study: Study, half: str, grid: dict) -> dict:
    """η, λ and the segment on one half: for each rule a search one coordinate at a time (lr, then decay, then
    segment) over the grid; the best point of the better rule, every trial recorded."""
    split, trials, best = study.half(half), [], {}
    for rule in ("sgd", "rms"):
        lrs = grid["lr"][rule]
        point = {"rule": rule, "lr": lrs[min(1, len(lrs) - 1)], **START}
        for key, values in (("lr", lrs), ("decay", grid["decay"]), ("segment", grid["segment"])):
            scores = {}
            for value in values:
                trial = point | {key: value}
                if (done := next((t for t in trials if all(t[k] == v for k, v in trial.items())), None)) is None:
                    score = study.dynamic(split, study.settings(**trial))  # each point of the grid run once
                    trials.append(done := trial | {"bpc": None if score is None else score.bpc})
                scores[value] = math.inf if done["bpc"] is None else done["bpc"]
            point[key] = min(scores, key=scores.get)
            best[rule] = point | {"bpc": scores[point[key]]}
    stateful = study.dynamic(split, study.settings(lr=0.0, segment=16))
    chosen = min(best.values(), key=lambda p: p["bpc"])
    return {"half": half, "run": str(study.folder), "stateful_bpc": stateful.bpc, "best_by_rule": best,
            "chosen": {k: v for k, v in chosen.items() if k != "bpc"}, "chosen_bpc": chosen["bpc"], "trials": trials}


def paired(a, b, mask, split) -> dict:
    """a − b on the targets `mask` marks, paired target by target."""
    from gru_experiments.study.scores import paired_difference, score_subset

    d = paired_difference(score_subset(a, mask, split), score_subset(b, mask, split), split)
    return {"bpc": d.bpc, "se": d.bpc_se, "targets": d.tokens}


def report(study: Study, chosen: dict, half: str, parts: bool) -> dict:
    """Every figure on `half` of the split, each pass over the whole split (see the module docstring)."""
    import torch

    from gru_experiments.study.cache import StreamStates, cache_figures, stateful_states
    from gru_experiments.study.scores import score_subset

    split, n = study.val, study.val.n_targets
    mask = torch.zeros(n + 1, dtype=torch.bool)
    mask[n // 2 + 1:] = half == "second"
    mask[1:n // 2 + 1] = half == "first"
    study.bar.set_postfix_str(f"{study.folder.name}: stateful")
    stateful, states = stateful_states(study.lm.model, split, study.window, study.streams, targets_after=0)
    study.bar.update(1)
    kept = []
    dynamic = study.dynamic(split, study.settings(**chosen), read=lambda c: kept.append(StreamStates.of_chunk(c)))
    out = {"run": str(study.folder), "seed": study.lm.run.seed, "half": half, "settings": chosen,
           "stateful_bpc": score_subset(stateful, mask, split).bpc}
    if dynamic is None:
        return out | {"diverged": True}
    out |= {"dynamic_bpc": score_subset(dynamic, mask, split).bpc, "gain": paired(dynamic, stateful, mask, split)}
    if half == "second":  # the cache fits on the first half: reported on the second only
        cache = cache_figures(states, split, study.window, stride=study.every)
        both = cache_figures(StreamStates.joined(kept), split, study.window, stride=study.every)
        out |= {"cache": _cache_part(cache, both)}
        out["by_reach"] = {str(n_): None if n_ is None else _reach(study, chosen, n_, stateful, mask)
                           for n_ in REACHES}
        out["by_reach"]["None"] = out["gain"]
        if parts:
            out["by_params"] = {"all": out["gain"]} | {
                part: _gain(study, chosen | {"params": part}, stateful, mask) for part in PARTS}
    return out


def _gain(study: Study, values: dict, stateful, mask) -> dict | None:
    score = study.dynamic(study.val, study.settings(**values))
    return None if score is None else paired(score, stateful, mask, study.val)


def _reach(study: Study, chosen: dict, n: int, stateful, mask) -> dict | None:
    return _gain(study, chosen | {"reset_every": max(n, chosen["segment"])}, stateful, mask)


def _cache_part(cache: dict, both: dict) -> dict:
    """The cache's figures on its targets (every k-th of the second half): stateful, cache, dynamic and cache +
    dynamic at each N, and their gains over stateful (additive: cache's + dynamic's)."""
    if "by_size" not in cache or "by_size" not in both:
        return {"note": cache.get("note") or both.get("note")}
    base, adapted = cache["model_bpc"], both["model_bpc"]
    sizes = {}
    for n, figure in cache["by_size"].items():
        joint = both["by_size"][n]["bpc"]
        sizes[n] = {"cache_gain": figure["bpc"] - base, "cache_se": figure["gain_se"],
                    "cache_dynamic_gain": joint - base, "additive": (figure["bpc"] - base) + (adapted - base)}
    return {"targets": cache["test_targets"], "every": cache["every"], "stateful_bpc": base, "dynamic_bpc": adapted,
            "dynamic_gain": adapted - base, "by_size": sizes}


def markdown(results: dict) -> str:
    lines = ["# Dynamic evaluation: the study", "", "Bits per character on the second half of the validation split; "
             "gains are − (fewer bits). dynamic − stateful paired target by target (± its standard error); the "
             "cache's columns on the cache's targets (every k-th of the second half), at N = 4096.", ""]
    for key, group in results["groups"].items():
        tuned = group.get("tuning", {})
        lines += [f"## {key}", "", f"tuned on {tuned.get('run', '?')} (first half): {tuned.get('chosen')}", "",
                  "| seed | stateful | dynamic | dynamic − stateful | cache − stateful | cache+dynamic − stateful | "
                  "additive |", "|---|--:|--:|--:|--:|--:|--:|"]
        for r in group["runs"]:
            if r.get("diverged") or "gain" not in r:
                lines.append(f"| {r.get('seed')} | {r.get('stateful_bpc', math.nan):.4f} | diverged | | | | |")
                continue
            c = (r.get("cache", {}).get("by_size") or {}).get("4096", {})
            lines.append(f"| {r['seed']} | {r['stateful_bpc']:.4f} | {r['dynamic_bpc']:.4f} | "
                         f"{r['gain']['bpc']:+.4f} ± {r['gain']['se']:.4f} | {_f(c.get('cache_gain'))} | "
                         f"{_f(c.get('cache_dynamic_gain'))} | {_f(c.get('additive'))} |")
        lines += ["", "Gain by reach (dynamic with the weights reset every N tokens, beside the cache of N), mean over "
                  "seeds:", "", "| N | dynamic − stateful | cache − stateful |", "|--:|--:|--:|"]
        for n in map(str, REACHES):
            dyn = _mean([(r.get("by_reach") or {}).get(n) for r in group["runs"]], "bpc")
            cache = _mean([(r.get("cache", {}).get("by_size") or {}).get(n) for r in group["runs"]], "cache_gain")
            lines.append(f"| {'never' if n == 'None' else n} | {_f(dyn)} | {_f(cache)} |")
        for r in group["runs"]:
            if "by_params" in r:
                lines += ["", f"Which weights carry it (seed {r['seed']}): " + ", ".join(
                    f"{p} {_f((g or {}).get('bpc'))}" for p, g in r["by_params"].items())]
            if "swapped" in r and "gain" in r["swapped"]:
                s = r["swapped"]
                lines += ["", f"Halves swapped (seed {r['seed']}: tuned on the second, {s['settings']}; on the first): "
                          f"dynamic − stateful {s['gain']['bpc']:+.4f} ± {s['gain']['se']:.4f}"]
        lines.append("")
    return "\n".join(lines + [f"machine: {results['machine']}; {results['seconds']:.0f} s in all."])


def _f(value) -> str:
    return "" if value is None else f"{value:+.4f}"


def _mean(items, key) -> float | None:
    values = [i[key] for i in items if i and i.get(key) is not None]
    return sum(values) / len(values) if values else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = {str(n): i for i, n in enumerate(REACHES)}
    for k, (key, group) in enumerate(results["groups"].items()):
        color = f"C{k % 10}"
        for name, get, style in (("dynamic", lambda r, n: (r.get("by_reach") or {}).get(n), "-o"),
                                 ("cache", lambda r, n: (r.get("cache", {}).get("by_size") or {}).get(n), "--s")):
            field = "bpc" if name == "dynamic" else "cache_gain"
            points = [(x[n], -_mean([get(r, n) for r in group["runs"]], field)) for n in x
                      if _mean([get(r, n) for r in group["runs"]], field) is not None]
            if points:
                ax.plot(*zip(*points), style, color=color, label=f"{key}: {name}")
    ax.set_xticks(range(len(REACHES)), [str(n or "never") for n in REACHES])
    ax.set_xlabel("reach N (tokens): dynamic reset every N; the cache's last N")
    ax.set_ylabel("bits per character saved over stateful")
    ax.set_title("Dynamic evaluation's gain by reach, beside the cache's")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plan_passes(groups: dict, grid: dict, swap: bool) -> int:
    tuning = 2 * (sum(len(v) for v in (next(iter(grid["lr"].values())), grid["decay"], grid["segment"])) - 2) + 1
    per_run = 2 + len(REACHES) - 1
    return sum(tuning * (1 + swap) + len(runs) * per_run + len(PARTS) + swap * 2 for runs in groups.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders or sweep folders")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="a two-point grid (a smoke check, not the study)")
    parser.add_argument("--streams", type=int, default=1, help="streams side by side (1: the document in order)")
    parser.add_argument("--cache-every", type=int, default=4, help="the cache's every k-th target (1: all)")
    parser.add_argument("--no-swap", action="store_true", help="leave out the swapped-halves check")
    parser.add_argument("--extend", type=Path, default=None,
                        help="an earlier study's dynamic_study.json: a group it holds keeps its tuning, its swapped "
                             "check and the runs it studied; only the runs it has not are studied (seeds trained "
                             "since), with its tuned values")
    args = parser.parse_args(argv)
    if args.extend is not None and not args.extend.is_file():
        print(f"dynamic_study: --extend {args.extend}: no such file (an earlier study's dynamic_study.json)",
              file=sys.stderr)
        return 2
    folders, problems = find_runs(args.runs)
    for line in problems:
        print(f"dynamic_study: {line}", file=sys.stderr)
    if not folders:
        return 2
    return run_study(folders, args)


def run_study(folders: list[Path], args) -> int:
    import platform

    import torch
    from tqdm.auto import tqdm

    from gru_experiments.errors import UserError
    from gru_experiments.files import finite_or_null, write_json

    out = args.out or ROOT / "outputs" / "dynamic_study" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    grid, started = (QUICK if args.quick else GRID), time.perf_counter()
    bar = tqdm(total=0, unit="pass", desc="dynamic study", file=sys.stderr)
    studies = {}
    for folder in folders:
        try:
            study = Study(folder, args.streams, args.cache_every, bar)
        except UserError as error:
            print(f"dynamic_study: {folder}: {error}", file=sys.stderr)
            continue
        studies.setdefault(study.key, []).append(study)
    if not studies:
        print("dynamic_study: no run could be studied (each said why above)", file=sys.stderr)
        return 2
    earlier = json.loads(args.extend.read_text())["groups"] if args.extend else {}
    studied = {Path(r["run"]).resolve() for group in earlier.values() for r in group["runs"]}
    studies = {key: [s for s in members if s.folder.resolve() not in studied] for key, members in studies.items()}
    bar.total = plan_passes({k: v for k, v in studies.items() if k not in earlier}, grid, not args.no_swap) + \
        sum(len(v) * (2 + len(REACHES) - 1) for k, v in studies.items() if k in earlier)
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}, " \
              f"{torch.get_num_threads()} thread(s)"
    results = {"grid": grid, "streams": args.streams, "machine": machine, "groups": dict(earlier), "seconds": 0.0}
    for key, members in studies.items():
        members.sort(key=lambda s: (s.lm.run.seed != 1, s.lm.run.seed))
        if key in earlier:  # tuned before: its values serve the seeds trained since
            group, tuner, swapped = earlier[key], None, None
        else:
            tuner = members[0]
            group = results["groups"][key] = {"tuning": tune(tuner, "first", grid), "runs": []}
            swapped = None if args.no_swap else tune(tuner, "second", grid)
            group["tuning_swapped"] = swapped
        for study in members:
            record = report(study, group["tuning"]["chosen"], "second", parts=study is tuner)
            if swapped is not None and study is tuner:
                record["swapped"] = report(study, swapped["chosen"], "first", parts=False)
            group["runs"].append(record)
            results["seconds"] = time.perf_counter() - started
            write_json(out / "dynamic_study.json", finite_or_null(results))
    bar.close()
    results["seconds"] = time.perf_counter() - started
    write_json(out / "dynamic_study.json", finite_or_null(results))
    (out / "dynamic_study.md").write_text(markdown(results))
    plot(results, out / "gain_by_reach.png")
    print(f"dynamic_study: {out / 'dynamic_study.md'}, dynamic_study.json, gain_by_reach.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
