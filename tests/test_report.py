"""The sweep report, built over fabricated sweep folders (fast: nothing is trained here)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from wandb_records import offline_runs

from gru_experiments.errors import NoResultsError
from gru_experiments.report.common import MISSING
from gru_experiments.report.report import build_report, format_table, log_to_wandb
from gru_experiments.report.sweep_folder import planned_jobs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROMPTS = ["ROMEO: ", "KING: ", "FIRST CITIZEN: "]
RECURRENT = "gru_experiments.models.recurrent.RecurrentLM"


def assert_valid_png(path: Path) -> None:
    from matplotlib import image
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as img:
        img.verify()
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def make_job(sweep: Path, num: int, model: str, cell="gru", tokenizer="char", summary=None, history=None,
             samples=None, logger="none") -> Path:
    """A job folder as a Hydra multirun job of train.py leaves it."""
    job = sweep / f"{num}_{model}"
    (job / ".hydra").mkdir(parents=True)
    logger_cfg = ({"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "gru-test", "group": None,
                   "name": "${model.name}"} if logger == "wandb" else {})
    OmegaConf.save({"model": {"name": model, "architecture": {"_target_": RECURRENT, "cell": cell}},
                    "tokenizer": {"kind": tokenizer}, "training": {"batching": "windows"},
                    "paths": {"output_dir": "${hydra:runtime.output_dir}"}, "logger": logger_cfg},
                   job / ".hydra" / "config.yaml")
    OmegaConf.save({"hydra": {"job": {"num": num}}}, job / ".hydra" / "hydra.yaml")
    if summary is not None:
        (job / "summary.json").write_text(json.dumps(summary))
    if history is not None:
        lines = ["step,epoch,metric,value"] + [f"{s},{e},{m},{v}" for s, e, m, v in history]
        (job / "history.csv").write_text("\n".join(lines) + "\n")
    if samples is not None:
        (job / "samples.json").write_text(json.dumps(samples))
    return job


def completed(model, family, tokenizer, bpc, modes=True, **extra):
    summary = {"status": "completed", "model": model, "family": family, "tokenizer": tokenizer,
               "parameters": 86_913, "train_loss": 1.4321, "val_loss": 1.5, "val_bpc": bpc,
               "tokens_per_second": 12_345.6, "wall_seconds": 75.0, **extra}
    if modes:
        summary.update(stateful_bpc=bpc - 0.05, stateless_bpc=bpc + 1.2, windowed_bpc=bpc, bigram_bpc=bpc + 1.1,
                       stateful_nll=1.0, stateless_nll=2.0, windowed_nll=1.1, bigram_nll=1.9)
    return summary


CURVE = [(2, 0, "train/loss", 3.5), (4, 0, "train/loss", 3.1), (4, 0, "val/loss", 3.0), (4, 0, "val/bpc", 4.3),
         (6, 1, "train/loss", 2.9), (8, 1, "train/loss", 2.7), (8, 1, "val/loss", 2.8), (8, 1, "val/bpc", 4.0)]


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Five planned models: two completed (one without the evaluation's modes or samples),
    one failed, one that never wrote a summary, one that never started."""
    sweep = tmp_path / "my_sweep"
    sweep.mkdir()
    OmegaConf.save({"hydra": {"overrides": {"task": [
        "model=astra_alpha,scribe_alpha,scribe_beta,astra_beta,leviathan", "preset=smoke"]}}}, sweep / "multirun.yaml")
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1), history=CURVE,
             samples={"prompts": PROMPTS,
                      "stateful": ["ROMEO: my lord,\nthe | king", "KING: <b>now</b>", "FIRST CITIZEN: so"],
                      "stateless": ["ROMEO: e e e", "KING: t t", "FIRST CITIZEN: a"],
                      "settings": {"temperature": 0.8, "length": 200}})
    make_job(sweep, 1, "scribe_alpha", tokenizer="spm",
             summary=completed("scribe_alpha", "gru", "spm", 2.4, modes=False), history=CURVE[:3])
    make_job(sweep, 2, "scribe_beta", tokenizer="spm",
             summary={"status": "failed", "model": "scribe_beta", "family": "gru", "tokenizer": "spm",
                      "error": "RuntimeError: Vocabulary size too high (1000)\nmore lines", "wall_seconds": 3.0})
    make_job(sweep, 3, "astra_beta")  # started, no summary
    return sweep


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_report_files_rows_and_what_is_missing(sweep):
    report = build_report(sweep)
    assert set(report.files) == {"results.csv", "report.md", "bpc_by_mode.png", "curves.png"}
    rows = read_csv(sweep / "results.csv")
    assert [(r["model"], r["status"]) for r in rows] == [
        ("astra_alpha", "completed"), ("scribe_alpha", "completed"), ("scribe_beta", "failed"),
        ("astra_beta", "incomplete"), ("leviathan", "missing")]
    alpha, scribe, failed = rows[0], rows[1], rows[2]
    assert float(alpha["stateful_bpc"]) == pytest.approx(2.05) and float(alpha["bigram_bpc"]) == pytest.approx(3.2)
    assert alpha["family"] == "gru" and alpha["tokenizer"] == "char" and int(alpha["parameters"]) == 86_913
    for key in ["parameters", "train_loss", "val_loss", "val_bpc", "stateful_bpc", "stateless_bpc", "windowed_bpc",
                "bigram_bpc", "tokens_per_second", "wall_seconds"]:
        assert math.isfinite(float(alpha[key])), key
    assert scribe["stateful_bpc"] == "" and scribe["tokenizer"] == "spm" and float(scribe["val_bpc"]) == 2.4
    assert failed["error"].startswith("RuntimeError: Vocabulary size too high")

    md = (sweep / "report.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| model | training | family | tokenizer | parameters | recipe | lr | train loss | "
                               "val loss | val bpc | stateful bpc")
    assert "| astra_alpha | windows | gru | char | 86,913 | — | — | 1.4321 | 1.5000 | 2.1000 | 2.0500 | 3.3000 " \
           "| 2.1000 " \
           "| 3.2000 | 12,346 | 1 min 15 s | completed |" in md
    scribe_row = next(line for line in table if line.startswith("| scribe_alpha"))
    assert scribe_row.count(MISSING) == 6  # the recipe and lr (an older run's config), the four inference modes
    assert "| leviathan | — | — | — |" in md and "| astra_beta | windows | gru | char |" in md
    missing = md.split("## What is missing")[1].split("##")[0]
    assert "**scribe_beta** failed (`2_scribe_beta`): RuntimeError: Vocabulary size too high (1000)" in missing
    assert "more lines" not in missing
    assert "**astra_beta** has no summary yet" in missing and "**leviathan** was planned but never started" in missing
    assert "`stateful_bpc`, `stateless_bpc`, `windowed_bpc`, `bigram_bpc` are not in the summary of: scribe_alpha" \
        in missing
    assert "no samples (samples.json) for: scribe_alpha" in missing
    assert "![bits per character by model and inference mode](bpc_by_mode.png)" in md and "(curves.png)" in md
    assert "Overrides: `model=astra_alpha,scribe_alpha,scribe_beta,astra_beta,leviathan preset=smoke`" in md


def test_samples_side_by_side(sweep):
    md = (build_report(sweep).files["report.md"]).read_text()
    samples = md.split("## Samples: stateful vs stateless")[1]
    assert "### astra_alpha" in samples and "### scribe_alpha" not in samples
    # newlines become <br>, pipes and HTML are escaped, so every sample stays inside its cell
    assert "| `ROMEO:` | ROMEO: my lord,<br>the \\| king | ROMEO: e e e |" in samples
    assert "| `KING:` | KING: &lt;b&gt;now&lt;/b&gt; | KING: t t |" in samples
    assert "Settings: temperature=0.8, length=200" in samples
    assert "No samples for: scribe_alpha." in samples


def test_plots_are_valid_pngs(sweep):
    report = build_report(sweep)
    for name in ("bpc_by_mode.png", "curves.png"):
        assert_valid_png(report.files[name])


def test_rebuilding_is_idempotent(sweep):
    first = {name: path.read_bytes() for name, path in build_report(sweep).files.items()}
    second = {name: path.read_bytes() for name, path in build_report(sweep).files.items()}
    assert first == second
    assert not list(sweep.glob("*.tmp"))


def test_report_without_inference_modes_plots_val_bpc(tmp_path):
    sweep = tmp_path / "s"
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1, modes=False))
    report = build_report(sweep)
    assert_valid_png(report.files["bpc_by_mode.png"])
    assert "curves.png" not in report.files  # no history.csv: no curves, and the report says so
    md = report.files["report.md"].read_text()
    assert "no job wrote history.csv" in md and "no job wrote samples.json" in md
    assert "astra_alpha" in format_table(report)


def test_stale_plot_is_removed(tmp_path):
    sweep = tmp_path / "s"
    job = make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1), history=CURVE)
    assert (build_report(sweep).files["curves.png"]).exists()
    (job / "history.csv").unlink()
    assert "curves.png" not in build_report(sweep).files and not (sweep / "curves.png").exists()


def test_folder_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(NoResultsError, match="not a folder"):
        build_report(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NoResultsError, match="no results in .*empty: no job folders"):
        build_report(empty)
    make_job(empty, 0, "astra_alpha")  # started, never summarised
    with pytest.raises(NoResultsError, match="1 job folders, none with a summary.json"):
        build_report(empty)


def test_planned_jobs_from_the_sweep_overrides():
    """Hydra's product of the swept values, in launch order (the job numbers)."""
    assert planned_jobs(["preset=smoke", "model=astra_alpha,scribe_beta"]) == [
        ["preset=smoke", "model=astra_alpha"], ["preset=smoke", "model=scribe_beta"]]
    assert planned_jobs(["model=leviathan"]) == [["model=leviathan"]]
    assert planned_jobs(["model=a,b", "seed=1,2"])[1:3] == [["model=a", "seed=2"], ["model=b", "seed=1"]]
    assert planned_jobs(["model.lr=interval(0.1,0.2)"]) == []


def test_wandb_summary_run_carries_table_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep = tmp_path / "wb_sweep"
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1,
                                                        best={"step": 100, "val_bpc": 2.2}), history=CURVE,
             logger="wandb")
    make_job(sweep, 1, "scribe_beta", tokenizer="spm", logger="wandb",
             summary={"status": "failed", "model": "scribe_beta", "error": "ValueError: boom"})
    report = build_report(sweep)
    log_to_wandb(report, mode="offline")
    [run] = offline_runs(sweep)
    assert run.group == "wb_sweep" and run.name == "summary" and run.exit_code == 0
    [logged] = [row for row in run.history if "results" in row]
    assert logged["results"]["_type"] == "table-file" and logged["results"]["nrows"] == 2
    assert logged["plots/bpc_by_mode"]["_type"] == "image-file" and logged["plots/curves"]["_type"] == "image-file"
    assert run.summary["astra_alpha/stateful_bpc"] == pytest.approx(2.05)
    assert run.summary["jobs_completed"] == 1 and run.summary["jobs_not_completed"] == 1
    table = json.loads(next(sweep.glob("wandb/offline-run-*/files/" + logged["results"]["path"])).read_text())
    assert [row[table["columns"].index("status")] for row in table["data"]] == ["completed", "failed"]
    # its best_* columns read as results.csv's (the best checkpoint's figures, not summary keys of that name)
    assert [row[table["columns"].index("best_val_bpc")] for row in table["data"]] == [2.2, None]


def test_ladder_table_and_plot_for_a_sweep_of_several_families(tmp_path):
    sweep = tmp_path / "ladder"
    make_job(sweep, 0, "ngram3", cell="ngram", summary=completed("ngram3", "ngram", "char", 2.9, context=2,
                                                                   parameters=12_673, train_seconds=0.9))
    make_job(sweep, 1, "mlp", cell="mlp", summary=completed("mlp", "mlp", "char", 2.6, context=16,
                                                            parameters=86_773, train_seconds=95.0))
    make_job(sweep, 2, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.3, context=None,
                                                        train_seconds=200.0))
    report = build_report(sweep)
    text = report.files["report.md"].read_text()
    assert "## The ladder" in text
    assert "| ngram3 | ngram | 2 | 12,673 | 2.8500 | 4.1000 | 2.9000 | 0.9 s |" in text
    assert "| mlp | mlp | 16 | 86,773 | 2.5500 | 3.8000 | 2.6000 | 1 min 35 s |" in text
    assert "| astra_alpha | gru | unbounded | 86,913 | 2.2500 | 3.5000 | 2.3000 | 3 min 20 s |" in text
    assert_valid_png(report.files["ladder.png"])

    single = tmp_path / "gru_only"
    make_job(single, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.3))
    report = build_report(single)
    assert "## The ladder" not in report.files["report.md"].read_text() and "ladder.png" not in report.files


def test_a_truncated_summary_is_named_unreadable_not_still_running(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    job = make_job(sweep, 1, "astra_beta")
    text = json.dumps(completed("astra_beta", "gru", "char", 2.0))
    (job / "summary.json").write_text(text[: len(text) // 2])  # cut off while it was written
    build_report(sweep)
    missing = (sweep / "report.md").read_text().split("## What is missing")[1].split("##")[0]
    assert f"its summary `{job / 'summary.json'}` is unreadable" in missing
    assert "still running" not in missing
