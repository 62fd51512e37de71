"""The report's *Overfitting onset* section and its finding (report/overfitting.py), over fabricated sweep folders:
every trained model's best step and final - best, and the original study's table (Astra-γ late, Scribe-γ medium,
Leviathan early) judged where the models ran, "not run" where they did not."""

from __future__ import annotations

import csv

from omegaconf import OmegaConf
from test_report import make_job

from gru_experiments.report.overfitting import onset, onset_finding
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import collect

# (model, tokenizer, (epochs, steps per epoch), steps trained, best step, final val bpc, best val bpc, stopped early)
RUNS = [("astra_alpha", "char", (10, 200), 2000, 2000, 1.80, 1.80, False),
        ("astra_gamma", "char", (20, 400), 8000, 1200, 1.75, 1.55, False),     # early (15%): the table says late
        ("scribe_beta", "spm", (15, 250), 1000, 500, 2.10, 1.46, True),        # stopped early at 1,000
        ("leviathan", "spm", (6, 250), 1500, 500, 1.90, 1.60, False)]          # 33%: early, as the table says


def make_sweep(root, runs=RUNS):
    sweep = root / "onset"
    sweep.mkdir()
    for num, (model, tokenizer, (epochs, per_epoch), trained, best, final, best_bpc, stopped) in enumerate(runs):
        summary = {"status": "completed", "model": model, "family": "lstm" if model == "leviathan" else "gru",
                   "tokenizer": tokenizer, "parameters": 1_000_000 + num, "train_steps": trained,
                   "val_bpc": final, "val_loss": final * 0.69, "lr": 3e-3,
                   "stopped_early": stopped, "stopped_at_step": trained if stopped else None,
                   "best": {"step": best, "val_bpc": best_bpc, "same_as_final": best == trained}}
        job = make_job(sweep, num, model, tokenizer=tokenizer, summary=summary)
        config = OmegaConf.load(job / ".hydra" / "config.yaml")
        config.model.epochs, config.model.steps_per_epoch, config.model.lr = epochs, per_epoch, 3e-3
        OmegaConf.save(config, job / ".hydra" / "config.yaml")
    return sweep


def test_every_trained_model_has_its_best_step_and_its_fall(tmp_path):
    report = build_report(make_sweep(tmp_path))
    text = report.files["report.md"].read_text()
    section = text.split("## Overfitting onset: the step of the best validation, by model", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines() if line.startswith("| ")}
    assert rows["astra_gamma"].split(" | ")[2:] == [
        "1,200 (epoch 3.0)", "8,000 of 8,000", "its recipe", "15%", "1.5500", "1.7500", "+0.2000", "early |"]
    assert "early stopping, step 1,000" in rows["scribe_beta (1,000 of 3,750 steps)"]
    assert rows["astra_alpha"].endswith("| +0.0000 | late |")  # best at its last step: never overfit
    assert rows["leviathan"].split(" | ")[-1] == "early |"
    table = {row["model"]: row for row in csv.DictReader(report.files["results.csv"].open())}
    assert float(table["astra_gamma"]["best_step_share"]) == 0.15
    assert abs(float(table["astra_gamma"]["final_minus_best_bpc"]) - 0.2) < 1e-9


def test_the_finding_judges_the_studys_table_where_its_models_ran(tmp_path):
    jobs, _ = collect(make_sweep(tmp_path))
    verdict, evidence = onset_finding(jobs)
    # Astra-γ: early, not late (differs); Leviathan: early (agrees); Scribe-γ did not run.
    assert verdict == "partly supported"
    assert "Scribe-γ (claimed medium): not run" in evidence
    assert ("astra_gamma: best validation at step 1,200 (epoch 3.0) of its recipe's 8,000 (15%), final - best "
            "+0.2000 bits per character: onset early (claimed late: differs)") in evidence
    assert "leviathan: best validation at step 500 (epoch 2.0) of its recipe's 1,500 (33%)" in evidence
    assert "(claimed early: agrees)" in evidence
    assert "agrees with the table for 1 of 2 runs judged; not run: Scribe-γ." in evidence
    assert "The other models of this sweep: astra_alpha: best validation at step 2,000" in evidence
    text = build_report(tmp_path / "onset").files["report.md"].read_text()
    assert "**Overfitting onset is late for Astra-γ, medium for Scribe-γ and early for Leviathan**: partly" in text


def test_none_of_the_tables_models_ran_or_past_their_onset(tmp_path):
    jobs, _ = collect(make_sweep(tmp_path, RUNS[:1]))
    verdict, evidence = onset_finding(jobs)
    assert verdict == "cannot be judged"
    assert "Astra-γ (claimed late): not run; Scribe-γ (claimed medium): not run; Leviathan (claimed early): not run" \
        in evidence
    # a cut run whose best is its last step says nothing about an onset after it
    cut = [("leviathan", "spm", (6, 250), 300, 300, 1.9, 1.9, False)]
    (tmp_path / "cut").mkdir()
    jobs, _ = collect(make_sweep(tmp_path / "cut", cut))
    assert onset(jobs[0]) is None
    verdict, evidence = onset_finding(jobs)
    assert verdict == "cannot be judged" and "onset later than step 300" in evidence
    # all of them differing: contradicted
    late = [("astra_gamma", "char", (20, 400), 8000, 1000, 1.9, 1.5, False),
            ("leviathan", "spm", (6, 250), 1500, 1500, 1.6, 1.6, False)]
    (tmp_path / "late").mkdir()
    jobs, _ = collect(make_sweep(tmp_path / "late", late))
    assert onset_finding(jobs)[0] == "contradicted"
