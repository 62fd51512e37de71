"""Past the window (experiments=past_window): its section and its finding follow the settings' numbers, judged over
seeds; the set composes at Astra-α's tokens per step; the smoke study runs every training and judges its finding."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from test_findings import summary
from test_report import make_job

from gru_experiments.report.past_window import past_window_finding
from gru_experiments.report.report import build_report
from gru_experiments.report.seed_groups import group_settings
from gru_experiments.report.sweep_folder import collect

CLAIM = "A gradient path past the window teaches the state to read past it"


def past_job(sweep, num, seed, mode, seq_len, gain, model="astra_alpha", cache=-0.17, recurrent=True):
    values = summary(model, "char", 86_913, 2.25, 3.7, 3.58)
    values.update(state_gain_bpc=gain, state_gain_se=0.0005, cache_past_window_bpc=cache, cache_past_window_se=0.01,
                  mode_evaluation={"window": 128}, recurrent=recurrent, train_seconds=100.0 + seed)
    job = make_job(sweep, num, model, summary=values)
    config = OmegaConf.load(job / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.merge(config, {"seed": seed, "training": {"batching": mode},
                                            "data": {"seq_len": seq_len}}), job / ".hydra" / "config.yaml")


def settings_of(sweep):
    runs, _ = collect(sweep)
    for job in runs:  # the summary's window is the config's (read_job reads it from the summary)
        job.values["seq_len"] = job.config["data"]["seq_len"]
    return group_settings(runs)


def judged(tmp_path, long_gains, base_gains=(0.0001, -0.0002), streams_gains=()):
    sweep = tmp_path / f"past{len(list(tmp_path.iterdir()))}"
    num = 0
    for seed, gain in enumerate(base_gains, 1):
        past_job(sweep, num, seed, "windows", 128, gain)
        num += 1
    for seed, gain in enumerate(streams_gains, 1):
        past_job(sweep, num, seed, "streams", 128, gain)
        num += 1
    for seed, gain in enumerate(long_gains, 1):
        past_job(sweep, num, seed, "streams", 2048, gain)
        num += 1
    return past_window_finding(settings_of(sweep))


def test_the_past_window_finding_is_supported_only_over_seeds(tmp_path):
    verdict, evidence = judged(tmp_path, [-0.020, -0.022, -0.018])
    assert verdict == "supported"
    assert "astra_alpha (streams (2048), n = 3)" in evidence and "-0.0200 ± 0.0012" in evidence
    assert "12% of the cache's" in evidence  # -0.020 of -0.17 past the window
    # Trainings that disagree: the mean is below -WORTH but not by two standard errors between them.
    assert judged(tmp_path, [-0.030, 0.001, -0.015])[0] == "not shown by this sweep"
    # One training: the within-run rule alone, which says nothing of a second training.
    assert judged(tmp_path, [-0.020])[0] == "partly supported"
    assert judged(tmp_path, [0.0001, -0.0003, 0.0002])[0] == "not shown by this sweep"


def test_the_past_window_finding_says_what_the_longer_path_adds_to_streams_cut_at_the_window(tmp_path):
    """The state may read past the window from carrying it alone (the code corpus, BPTT 128): the finding says so,
    and what the longer gradient path adds, paired by seed."""
    verdict, evidence = judged(tmp_path, [-0.020, -0.022, -0.018], streams_gains=[-0.012, -0.016, -0.014])
    assert verdict == "supported"
    assert ("on streams with the gradient cut at the window (streams (128), n = 3) the state gains -0.0140 ± 0.0012 "
            "by itself, so the longer path adds -0.0060 ± 0.0012 (shown)") in evidence
    same = judged(tmp_path, [-0.020, -0.022, -0.018], streams_gains=[-0.019, -0.023, -0.018])[1]
    assert "so the longer path adds +0.0000 ± 0.0006 (not shown)" in same
    assert "gradient cut at the window" not in judged(tmp_path, [-0.020, -0.022, -0.018])[1]


def test_without_a_training_past_the_window_its_finding_cannot_be_judged(tmp_path):
    sweep = tmp_path / "base"
    for seed in (1, 2):
        past_job(sweep, seed, seed, "windows", 128, 0.0)
    assert past_window_finding(settings_of(sweep))[0] == "cannot be judged"


@pytest.mark.parametrize("name, mode, seq_len, batch, family", [
    ("windows128", "windows", 128, 64, "gru"), ("streams2048", "streams", 2048, 4, "gru"),
    ("windows2048", "windows", 2048, 4, "gru"), ("lstm_streams2048", "streams", 2048, 4, "lstm"),
    ("transformer1024", "windows", 1024, 8, "transformer")])
def test_the_set_keeps_astra_alphas_tokens_per_step_and_scores_the_window_at_128(compose_config, name, mode, seq_len,
                                                                                 batch, family):
    cfg = compose_config(f"experiment=past_window_{name}")
    assert (cfg.training.batching, cfg.data.seq_len, cfg.data.batch_size) == (mode, seq_len, batch)
    assert cfg.data.seq_len * cfg.data.batch_size == 64 * 128 and cfg.model.epochs * cfg.model.steps_per_epoch == 2000
    assert cfg.evaluation.window == 128 and cfg.evaluation.curve_longest == 4096
    assert cfg.model.architecture.get("forget_bias", 0) == (1.0 if family == "lstm" else 0)


@pytest.mark.slow
def test_the_smoke_study_runs_every_training_and_judges_its_finding(tiny_corpus, data_dir, tmp_path):
    """The smoke preset trains every job on windows of 32: the windowed mode at 16 puts each training past it, and a
    validation split of 5% in 4 streams gives the paired stateful - windowed its targets."""
    from test_sweep import read_rows, run_script, tiny_overrides

    sweep = tmp_path / "past"
    result = run_script("sweep.py", "experiments=past_window", "seeds=2", "logger=none", *tiny_overrides(tiny_corpus,
                        data_dir), "evaluation.window=16", "evaluation.curve_longest=64", "evaluation.streams=4",
                        "data.train_fraction=0.95", f"hydra.sweep.dir={sweep}")  # long enough streams to pair on
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    settings = [row for row in read_rows(sweep) if row["row"] == "setting"]
    assert len(settings) == 8 and {row["n"] for row in settings} == {"2"}
    report = build_report(sweep)
    [line] = [line for line in report.files["report.md"].read_text().splitlines() if f"**{CLAIM}**" in line]
    assert "cannot be judged" not in line and "Rests on" in line

