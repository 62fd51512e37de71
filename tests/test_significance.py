"""The sections' findings tell figures apart by significance.difference: over a setting of several trainings the
spread between them decides, not the within-run standard errors (report/scale.py's finding as the example)."""

from __future__ import annotations

from gru_experiments.report.scale import SCALE
from gru_experiments.report.seed_groups import Setting
from gru_experiments.report.sweep_folder import JobResult

SEEDS = (1, 2, 3)


def run(model: str, parameters: int, seed: int, gain: float) -> JobResult:
    """One training at the scale study's settings: stateful - windowed `gain`, a tight within-run se."""
    values = {"model": model, "family": "gru", "recurrent": True, "tokenizer": "char", "training_mode": "windows",
              "parameters": parameters, "seed": seed, "stateful_bpc": 2.0, "stateful_bpc_se": 0.01,
              "state_gain_bpc": gain, "state_gain_se": 0.0005}
    return JobResult(f"{seed}_{model}", "completed", values)


def sweep(large_gains) -> list:
    """astra_alpha (every seed: stateful - windowed -0.001) and astra_gamma (`large_gains` by seed), each a
    setting of three trainings."""
    small = Setting.of([run("astra_alpha", 86_913, seed, -0.001) for seed in SEEDS])
    large = Setting.of([run("astra_gamma", 4_383_041, seed, gain) for seed, gain in zip(SEEDS, large_gains)])
    return [small, large]


def test_the_spread_between_trainings_decides_whether_the_gain_grows():
    # The largest model gains 0.02 more on average (windowed - stateful 0.030, -0.010, 0.040 by seed), which the
    # within-run standard errors (0.0005) would call shown; the trainings disagree: paired by seed, the change is
    # +0.01900 ± 0.01528 (gaps 0.029, -0.011, 0.039), not two standard errors from zero.
    [disagreeing] = SCALE.judge(sweep((-0.030, 0.010, -0.040)))
    assert disagreeing.verdict == "contradicted"
    assert "largest - smallest +0.01900 ± 0.01528 (does not grow" in disagreeing.evidence
    assert "Rests on 3 trainings a side" in disagreeing.evidence and "1 paired by seed" in disagreeing.evidence
    # The same mean judged by one training a side (the settings' means and within-run se's): shown.
    single = [JobResult(setting.job, "completed", dict(setting.values)) for setting in sweep((-0.030, 0.010, -0.040))]
    [within] = SCALE.judge(single)
    assert within.verdict == "supported" and "(grows" in within.evidence
    assert "Rests on one training each" in within.evidence
    # Trainings that agree (0.020, 0.021, 0.019 by seed): the change is shown over seeds too.
    [agreeing] = SCALE.judge(sweep((-0.020, -0.021, -0.019)))
    assert agreeing.verdict == "supported" and "largest - smallest +0.01900 ± 0.00058 (grows" in agreeing.evidence
