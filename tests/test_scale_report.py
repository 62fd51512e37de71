"""The report's *Scale* section and its finding (report/scale.py), over fabricated sweep folders of the scale
study (python sweep.py experiments=scale): the table's figures are the summaries', the cut runs say so, the
curves share one axis of characters, and the finding follows the numbers."""

from __future__ import annotations

import math

import pytest
from conftest import finding_line
from omegaconf import OmegaConf
from test_report import assert_valid_png, make_job

from gru_experiments.report.report import build_report
from gru_experiments.report.scale import PLOT_SCALE, chars_per_token, scale_jobs, state_gain_grows_finding
from gru_experiments.report.sweep_folder import collect

# (model, tokenizer, parameters, recipe steps (epochs, steps per epoch), stateful - windowed, its se)
SCALE = [("astra_alpha", "char", 86_913, (10, 200), -0.0002, 0.0002),
         ("astra_beta", "char", 715_713, (15, 250), -0.0010, 0.0004),
         ("astra_gamma", "char", 4_383_041, (20, 400), -0.0200, 0.0010),
         ("scribe_alpha", "spm", 1_075_688, (10, 200), -0.0001, 0.0005),
         ("scribe_beta", "spm", 5_102_056, (15, 250), -0.0003, 0.0005)]
CHARS_PER_TOKEN = {"char": 1.0, "spm": 3.9}


def make_scale_sweep(root, rows=SCALE):
    sweep = root / "scale"
    sweep.mkdir()
    for num, (model, tokenizer, parameters, (epochs, per_epoch), gain, se) in enumerate(rows):
        stateful = 2.0 - parameters / 1e8
        nll = stateful * math.log(2) * CHARS_PER_TOKEN[tokenizer]  # nats per token
        summary = {"status": "completed", "model": model, "family": "gru", "tokenizer": tokenizer,
                   "parameters": parameters, "train_steps": 2000, "train_seconds": 600.0, "seq_len": 128,
                   "val_bpc": stateful + 0.05, "stateful_bpc": stateful, "stateful_bpc_se": 0.01,
                   "stateful_nll": nll, "windowed_bpc": stateful - gain, "windowed_bpc_se": 0.02,
                   "stateless_bpc": 3.6, "stateless_bpc_se": 0.005, "bigram_bpc": 3.58, "bigram_bpc_se": 0.005,
                   "state_gain_bpc": gain, "state_gain_se": se,
                   "context_curve": {"1": 3.6, "128": stateful - gain, "1024": stateful - gain, "stateful": stateful},
                   "best": {"step": 1200, "val_bpc": stateful}}
        job = make_job(sweep, num, model, tokenizer=tokenizer, summary=summary)
        config = OmegaConf.load(job / ".hydra" / "config.yaml")
        config.model.epochs, config.model.steps_per_epoch = epochs, per_epoch
        OmegaConf.save(config, job / ".hydra" / "config.yaml")
    return sweep


def test_the_scale_section_gives_every_model_its_steps_modes_and_gain(tmp_path):
    report = build_report(make_scale_sweep(tmp_path))
    text = report.files["report.md"].read_text()
    section = text.split("## Scale: the models by size", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| astra") or line.startswith("| scribe")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| astra_alpha", "| astra_beta", "| astra_gamma", "| scribe_alpha", "| scribe_beta"]
    gamma = rows[2]
    assert "2,000 of 8,000" in gamma and "4,383,041" in gamma
    assert "+0.02000 ± 0.00100 (128 tokens)" in gamma  # windowed - stateful: the state's gain, positive
    assert "3.6000 ± 0.0050" in gamma  # stateless with its standard error
    assert "1.9562 at step 1,200, final 2.0062" in gamma
    # The cut is said wherever the model is named: the results table too.
    assert "| astra_gamma (2,000 of 8,000 steps) |" in text.split("## What is missing", 1)[0]
    assert PLOT_SCALE in report.files
    assert_valid_png(report.files[PLOT_SCALE])


def test_a_subword_curve_is_drawn_in_characters(tmp_path):
    jobs, _ = collect(make_scale_sweep(tmp_path))
    spm = next(job for job in jobs if job.name == "scribe_beta")
    assert chars_per_token(spm) == pytest.approx(3.9)
    assert chars_per_token(jobs[0]) == pytest.approx(1.0)


def test_the_scale_finding_follows_the_gain_by_size(tmp_path):
    text = build_report(make_scale_sweep(tmp_path)).files["report.md"].read_text()
    line = finding_line(text, "The carried state's gain grows with capacity")
    # char: gamma gains 0.0198 ± 0.0010 more than alpha (grows); spm: 0.0002 ± 0.0007 (does not): partly.
    assert ": partly supported." in line
    assert "largest - smallest +0.01980 ± 0.00102 (grows" in line
    assert "largest - smallest +0.00020 ± 0.00071 (does not grow" in line

    flat = [(m, t, p, s, -0.0002, 0.0002) for m, t, p, s, _, _ in SCALE]
    (tmp_path / "flat").mkdir()
    jobs, _ = collect(make_scale_sweep(tmp_path / "flat", flat))
    verdict, evidence = state_gain_grows_finding(jobs)
    assert verdict == "contradicted" and "for 0 of 2 tokenizers" in evidence
    assert "takes nothing worth carrying" in evidence


def test_no_scale_without_two_sizes_of_one_tokenizer(tmp_path):
    rows = [SCALE[0], SCALE[3]]  # one char model, one spm model
    jobs, _ = collect(make_scale_sweep(tmp_path, rows))
    assert scale_jobs(jobs) == []
    verdict, evidence = state_gain_grows_finding(jobs)
    assert verdict == "cannot be judged" and "two sizes" in evidence
    assert "## Scale" not in build_report(tmp_path / "scale").files["report.md"].read_text()
