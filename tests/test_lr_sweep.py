"""The report's learning-rate sweep (report/lr_sweep.py): the table of model x recipe x learning rate, the
labels that tell the runs apart, and the GRU-against-transformer finding with each family at its best, over
fabricated sweep folders."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from omegaconf import OmegaConf
from test_findings import finding_lines, summary
from test_report import assert_valid_png

from gru_experiments.report.lr_sweep import PLOT_LR, arms, at_best
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import collect

GRU, TRANSFORMER = ("astra_alpha", "gru", 86_913), ("transformer", "transformer", 87_480)
ORIGINAL_TRANSFORMER = ("transformer_original", "transformer", 87_480)


def make_lr_sweep(root: Path, runs) -> Path:
    """runs: [((model, family, parameters), recipe, lr, stateful bpc, None for a diverged run or "running"
    for one with no summary yet)]."""
    sweep = root / "lr"
    sweep.mkdir(parents=True)
    for num, ((model, family, parameters), recipe, lr, stateful) in enumerate(runs):
        job = sweep / f"{num}_{model}"
        (job / ".hydra").mkdir(parents=True)
        OmegaConf.save({"model": {"name": model, "lr": lr, "architecture": {"cell": family}},
                        "optim": {"name": recipe}, "tokenizer": {"kind": "char"}, "training": {"batching": "windows"},
                        "logger": {}},
                       job / ".hydra" / "config.yaml")
        OmegaConf.save({"hydra": {"job": {"num": num}}}, job / ".hydra" / "hydra.yaml")
        if stateful == "running":
            continue
        if stateful is None:
            values = {"status": "failed", "model": model, "family": family,
                      "error": "training diverged: the loss is nan at training step 7 (epoch 0)"}
        else:
            values = summary(model, "char", parameters, stateful, 3.78, 3.58) | {
                "family": family, "stateful_bpc_se": 0.004, "train_seconds": 120.0 * (num + 1)}
        (job / "summary.json").write_text(json.dumps(values))
    return sweep


RUNS = [(GRU, "original", 1e-3, 2.40), (GRU, "original", 3e-3, 2.31), (GRU, "original", 1e-2, None),
        (TRANSFORMER, "transformer", 1e-3, 2.60), (TRANSFORMER, "transformer", 3e-3, 2.45),
        (TRANSFORMER, "transformer", 1e-2, 2.38),
        (ORIGINAL_TRANSFORMER, "original", 1e-3, 2.70), (ORIGINAL_TRANSFORMER, "original", 3e-3, 2.52)]


def test_the_table_has_a_row_per_model_and_recipe_and_a_column_per_learning_rate(tmp_path):
    sweep = make_lr_sweep(tmp_path, RUNS)
    report = build_report(sweep)
    text = report.files["report.md"].read_text()
    section = text.split("## Learning rate and recipe", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in section.splitlines() if line.startswith("| ")}
    assert "| lr 0.001 | lr 0.003 | lr 0.01 | best lr |" in rows["model"]
    assert rows["astra_alpha"].startswith("| astra_alpha | windows | original | 2.4000 ± 0.0040 | "
                                          "**2.3100 ± 0.0040** | diverged | 0.003 |")
    assert "| 2.6000 ± 0.0040 | 2.4500 ± 0.0040 | **2.3800 ± 0.0040** | 0.01 |" in rows["transformer"]
    assert "| **2.5200 ± 0.0040** |  | 0.003 |" in rows["transformer_original"]  # not run at 1e-2: an empty cell
    assert ("Each family at its best (the lowest stateful figure of its size): astra_alpha, recipe original, lr 0.003: "
            "2.3100 (best of 2); transformer, recipe transformer, lr 0.01: 2.3800 (best of 5).") in section
    assert_valid_png(report.files[PLOT_LR])
    with open(report.files["results.csv"], newline="") as f:
        table = list(csv.DictReader(f))
    assert [(row["model"], row["optim"], row["lr"]) for row in table][:2] == [
        ("astra_alpha", "original", "0.001"), ("astra_alpha", "original", "0.003")]  # its own columns


def test_finding_seven_compares_each_family_at_its_best_and_names_its_recipe(tmp_path):
    sweep = make_lr_sweep(tmp_path, RUNS)
    line = finding_lines(build_report(sweep).files["report.md"].read_text())[6]
    assert "supported" in line and "GRU - transformer -0.0700" in line
    assert ("astra_alpha (86,913 parameters; recipe original, lr 0.003, the best of 2 runs on the validation split) "
            "2.3100") in line
    assert ("transformer (87,480; recipe transformer, lr 0.01, the best of 5 runs on the validation split) "
            "2.3800") in line
    jobs, _ = collect(sweep)
    assert [job.model for job in at_best(jobs)] == ["astra_alpha (lr 0.003)", "transformer (lr 0.01)"]


def test_a_sweep_of_one_learning_rate_per_model_has_no_table_and_plain_labels(tmp_path):
    sweep = make_lr_sweep(tmp_path, [(GRU, "original", 3e-3, 2.31), (TRANSFORMER, "transformer", 3e-3, 2.45)])
    report = build_report(sweep)
    jobs, _ = collect(sweep)
    assert arms(jobs) == {} and [job.model for job in jobs] == ["astra_alpha", "transformer"]
    assert "## Learning rate and recipe" not in report.files["report.md"].read_text()
    assert PLOT_LR not in report.files


def test_a_model_under_two_recipes_is_labelled_by_its_recipe(tmp_path):
    sweep = make_lr_sweep(tmp_path, [(TRANSFORMER, "transformer", 3e-3, 2.45), (TRANSFORMER, "original", 3e-3, 2.52)])
    jobs, _ = collect(sweep)
    assert [job.model for job in jobs] == ["transformer (recipe transformer)", "transformer (recipe original)"]


def test_runs_that_differ_in_their_seed_alone_are_labelled_by_it(tmp_path):
    sweep = make_lr_sweep(tmp_path, [(GRU, "original", 3e-3, 2.31), (GRU, "original", 3e-3, 2.33)])
    for num, seed in enumerate((1234, 1)):  # the second trained with seed=1
        config = next(sweep.glob(f"{num}_*")) / ".hydra" / "config.yaml"
        OmegaConf.save(OmegaConf.merge(OmegaConf.load(config), {"seed": seed}), config)
    jobs, _ = collect(sweep)
    assert [job.model for job in jobs] == ["astra_alpha (seed 1234)", "astra_alpha (seed 1)"]


def test_a_run_still_going_is_marked_and_never_the_best(tmp_path):
    sweep = make_lr_sweep(tmp_path, [(GRU, "original", 3e-3, 2.31), (GRU, "original", 1e-2, "running"),
                                     (TRANSFORMER, "transformer", 3e-3, 2.45)])
    section = build_report(sweep).files["report.md"].read_text().split("## Learning rate and recipe", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| astra_alpha |"))
    assert row.startswith("| astra_alpha | windows | original | **2.3100 ± 0.0040** | incomplete | 0.003 |")


def test_runs_that_differ_in_their_training_window_are_labelled_by_it(tmp_path):
    """experiments=past_window trains one model on streams of 128, 512 and 2,048: three settings, three labels
    (one label for all three pooled their W&B summary keys and read as one row thrice)."""
    sweep = make_lr_sweep(tmp_path, [(GRU, "original", 3e-3, 2.31), (GRU, "original", 3e-3, 2.29)])
    for num, window in enumerate((128, 2048)):
        path = next(sweep.glob(f"{num}_*")) / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "seq_len": window}))
    jobs, _ = collect(sweep)
    assert [job.model for job in jobs] == ["astra_alpha (window 128)", "astra_alpha (window 2048)"]
    path = sweep / "1_astra_alpha" / "summary.json"  # and the same training on two corpora
    path.write_text(json.dumps({**json.loads(path.read_text()), "seq_len": 128}))
    config = sweep / "1_astra_alpha" / ".hydra" / "config.yaml"
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(config), {"data": {"path": "/texts/code.txt"}}), config)
    jobs, _ = collect(sweep)
    assert [job.model for job in jobs] == ["astra_alpha (tinyshakespeare)", "astra_alpha (code)"]
