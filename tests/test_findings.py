"""The report's study figures (context curve, modes over training, best vs final) and its
*Findings*, over fabricated sweep folders: the figures must be the summaries' numbers, and the
findings must follow the numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import finding_line
from test_report import assert_valid_png, make_job

from gru_experiments.report.findings import STUDY
from gru_experiments.report.plots import PLOT_CONTEXT, PLOT_MODES, context_curve_series, modes_over_training_series
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import collect
from gru_experiments.report.training_grid import PLOT_GRID

# (model, tokenizer, parameters, stateful, stateless, bigram)
MODELS = [("astra_alpha", "char", 86_913, 2.31, 3.78, 3.58),
          ("astra_beta", "char", 715_713, 2.05, 3.70, 3.58),
          ("scribe_alpha", "spm", 1_075_688, 2.25, 2.79, 2.85)]


def summary(model, tokenizer, parameters, stateful, stateless, bigram, best_step=2000, best_val=None):
    curve = {"1": stateless, "2": stateless - 0.5, "4": stateful + 0.3, "8": stateful + 0.02,
             "stateful": stateful, "settings": {"max_window": 8, "targets": {}, "stride": {}}}
    val = stateful + 0.03
    best_val = val if best_val is None else best_val
    return {"status": "completed", "model": model, "family": "gru", "tokenizer": tokenizer, "parameters": parameters,
            "train_loss": 1.5, "val_loss": 1.6, "val_bpc": val, "stateful_bpc": stateful,
            "stateless_bpc": stateless, "windowed_bpc": stateful + 0.02, "bigram_bpc": bigram,
            "train_steps": 2000, "train_tokens": 2000 * 64 * 128, "context_curve": curve,
            "best": {"step": best_step, "same_as_final": best_step == 2000, "val_bpc": best_val,
                     "stateful_bpc": stateful - 0.01, "stateless_bpc": stateless, "windowed_bpc": stateful}}


def history(stateful_first, stateful_last, stateless_first, stateless_last):
    rows = [(10, 0, "train/loss", 3.9), (2000, 9, "train/loss", 1.5)]
    for step, sf, sl in ((200, stateful_first, stateless_first), (2000, stateful_last, stateless_last)):
        rows += [(step, 0, "val/loss", 2.0), (step, 0, "val/bpc", sf + 0.03),
                 (step, 0, "val/stateful_bpc", sf), (step, 0, "val/stateless_bpc", sl)]
    return rows


def make_sweep(root: Path, models=MODELS, **changes) -> Path:
    """A study sweep folder; `changes` maps a model to summary() keyword overrides."""
    sweep = root / "study"
    sweep.mkdir(parents=True)
    for num, (model, tokenizer, parameters, stateful, stateless, bigram) in enumerate(models):
        values = dict(stateful=stateful, stateless=stateless, bigram=bigram) | changes.get(model, {})
        make_job(sweep, num, model, tokenizer=tokenizer,
                 summary=summary(model, tokenizer, parameters, **values),
                 history=history(values["stateful"] + 0.5, values["stateful"], values["stateless"] + 0.2,
                                 values["stateless"]))
    return sweep


SUBWORD = "Subword models amplify inference-time errors"


def finding_lines(report_md: str) -> list[str]:
    section = report_md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if re.match(r"\d\. ", line)]


def test_the_study_plots_are_the_summaries_numbers(tmp_path):
    sweep = make_sweep(tmp_path)
    report = build_report(sweep)
    for name in (PLOT_CONTEXT, PLOT_MODES):
        assert_valid_png(report.files[name])
        assert f"]({name})" in (sweep / "report.md").read_text()
    jobs, _ = collect(sweep)
    series = context_curve_series(jobs)
    for job in jobs:
        curve = job.values["context_curve"]
        assert series[job.model]["windows"] == [(w, curve[str(w)]) for w in (1, 2, 4, 8)]
        assert series[job.model]["stateful"] == job.values["stateful_bpc"]
    over_training = modes_over_training_series(jobs)
    alpha = next(job for job in jobs if job.model == "astra_alpha")
    assert over_training["astra_alpha"]["stateful"] == [(200 * 64 * 128, pytest.approx(2.81)),
                                                        (2000 * 64 * 128, 2.31)]
    assert over_training["astra_alpha"]["stateless"][-1] == (2000 * 64 * 128, alpha.values["stateless_bpc"])



def test_modes_over_training_leaves_out_counted_models():
    """A counted model (an n-gram: train_steps 0) has one validation and nothing over training."""
    from gru_experiments.report.sweep_folder import JobResult

    trained = JobResult("0_astra_alpha", "completed", {"model": "astra_alpha", "train_steps": 2000,
                                                       "train_tokens": 2000 * 64 * 128},
                        history={"val/stateful_bpc": [(2000, 2.31)], "val/stateless_bpc": [(2000, 3.78)]})
    counted = JobResult("1_ngram6", "completed", {"model": "ngram6", "train_steps": 0, "train_tokens": 1_003_854},
                        history={"val/stateful_bpc": [(0, 2.20)], "val/stateless_bpc": [(0, 4.46)]})
    assert list(modes_over_training_series([trained, counted])) == ["astra_alpha"]

def test_findings_state_the_measured_figures(tmp_path):
    lines = finding_lines((build_report(make_sweep(tmp_path)).files["report.md"]).read_text())
    assert len(lines) == len(STUDY.rules) and all(claim in line for claim, line in zip(STUDY.rules, lines))
    line = dict(zip(STUDY.rules, lines)).__getitem__  # a finding's line by its claim, wherever it stands
    # no model trained both ways here; no transformer.
    grid = line("Training with the state carried makes the state worth carrying")
    rival = line("GRUs remain competitive with transformers")
    assert "cannot be judged" in grid and "models=grid training=windows,streams" in grid
    assert "cannot be judged" in rival and "models=beta" in rival
    # stateless vs bigram: worse for both char models, better for the spm one.
    stateless = line("A GRU without carried state is functionally non-recurrent")
    assert "partly supported" in stateless and "worse than the count bigram for 2 of 3" in stateless
    # resetting costs spm 0.54, char (1.47 + 1.65) / 2 = 1.56: contradicted, and said so.
    subword = line(SUBWORD)
    assert "contradicted" in subword and "subword models 0.540 and character models 1.560" in subword
    assert "lose less" in subword
    # astra_alpha stateful 2.31 beats the stateless figures of both larger models.
    assert "supported" in line("Correctness precedes scale") and "beats 2 of 2 larger models" in line(
        "Correctness precedes scale")
    # every best checkpoint is the final one here.
    loss = line("Training loss alone cannot validate a recurrent model")
    assert "not shown by this sweep" in loss and "0 of 3" in loss


def test_findings_change_when_the_numbers_do(tmp_path):
    before = finding_lines(build_report(make_sweep(tmp_path / "a")).files["report.md"].read_text())
    # The subword model now loses 2.0 bits per character without its state, and overfits.
    after = finding_lines(build_report(make_sweep(tmp_path / "b", scribe_alpha=dict(
        stateless=4.25, best_step=600, best_val=2.168))).files["report.md"].read_text())
    assert "contradicted" in before[3] and after[3] == finding_line("\n".join(after), SUBWORD)
    assert after[3].split("**: ", 1)[1].startswith("supported")
    assert "subword models 2.000" in after[3]
    assert "1 of 3" in after[0] and "best 2.1680 at step 600" in after[0] and after[0] != before[0]
    assert "3 of 3" in after[1] and "supported" in after[1]


def test_findings_say_what_is_missing(tmp_path):
    one = [MODELS[0]]
    lines = finding_lines(build_report(make_sweep(tmp_path, models=one)).files["report.md"].read_text())
    assert "cannot be judged" in lines[3] and "no subword (spm) model" in lines[3]
    assert "cannot be judged" in lines[4] and "at least two sizes" in lines[4]
    assert "Missing: models of one tokenizer at two sizes" in lines[2]
    assert [f.verdict for f in STUDY.judge([])] == ["cannot be judged"] * len(STUDY.rules)


def test_best_and_final_weights_side_by_side(tmp_path):
    sweep = make_sweep(tmp_path, scribe_alpha=dict(best_step=600, best_val=2.168))
    text = build_report(sweep).files["report.md"].read_text()
    section = text.split("## Best checkpoint and final weights", 1)[1].split("\n## ", 1)[0]
    assert "| scribe_alpha | best | 600 | 2.1680 |" in section
    assert "| scribe_alpha | final | 2000 | 2.2800 |" in section
    assert "| astra_alpha | best (= final) | 2000 |" in section
    rows = {row["model"]: row for row in __import__("csv").DictReader(open(sweep / "results.csv"))}
    assert rows["scribe_alpha"]["best_step"] == "600" and float(rows["scribe_alpha"]["best_val_bpc"]) == 2.168


def make_grid_sweep(root: Path, gains: dict) -> Path:
    """A sweep of models trained both ways; gains: {(model, mode): (stateful - windowed, its s.e.)}."""
    sweep = root / "grid"
    sweep.mkdir(parents=True)
    for num, ((model, mode), (gain, se)) in enumerate(gains.items()):
        values = summary(model, "char", 86_913, 2.30 + gain, 3.78, 3.58) | {
            "training_mode": mode, "windowed_bpc": 2.30, "state_gain_bpc": gain, "state_gain_se": se,
            "train_seconds": 200.0 + num, "mode_evaluation": {"window": 128}}
        values["context_curve"]["settings"]["longest"] = 1024
        make_job(sweep, num, model, summary=values)
    return sweep


def test_the_training_grid_and_the_sixth_finding(tmp_path):
    sweep = make_grid_sweep(tmp_path, {("astra_alpha", "windows"): (0.002, 0.001),
                                       ("astra_alpha", "streams"): (-0.050, 0.004),
                                       ("astra_beta", "windows"): (0.003, 0.001),
                                       ("astra_beta", "streams"): (-0.080, 0.005)})
    report = build_report(sweep)
    assert_valid_png(report.files[PLOT_GRID])
    text = (sweep / "report.md").read_text()
    grid = text.split("## Training mode against inference mode", 1)[1].split("\n## ", 1)[0]
    assert "| astra_alpha | windows | 2.3020 | 2.3000 | 3.7800 | +0.00200 ± 0.00100 | 3 min 20 s |" in grid
    assert "| astra_beta | streams | 2.2200 | 2.3000 | 3.7800 | -0.08000 ± 0.00500 | 3 min 23 s |" in grid
    assert "windowed: the last 128 tokens; the context curve's longest point: 1024 tokens" in grid
    assert f"]({PLOT_GRID})" in grid
    sixth = finding_line(text, "Training with the state carried makes the state worth carrying")
    assert sixth.split("**: ", 1)[1].startswith("supported.")
    assert ("astra_alpha: stateful - windowed (128 tokens) +0.00200 ± 0.00100 trained on windows, "
            "-0.05000 ± 0.00400") in sixth
    # The report tells the two trainings of a model apart.
    assert "| astra_alpha (streams) | streams |" in text


@pytest.mark.parametrize("streams_gain, verdict", [((-0.001, 0.004), "not shown by this sweep"),
                                                   ((0.050, 0.004), "contradicted"),
                                                   # two standard errors, but too small to be worth the state
                                                   ((-0.0002, 0.00005), "not shown by this sweep")])
def test_the_sixth_finding_follows_the_numbers(tmp_path, streams_gain, verdict):
    sweep = make_grid_sweep(tmp_path, {("astra_alpha", "windows"): (0.002, 0.001),
                                       ("astra_alpha", "streams"): streams_gain})
    sixth = finding_lines(build_report(sweep).files["report.md"].read_text())[5]
    assert f"carrying**: {verdict}." in sixth and "Supported for 0 of 1 models" in sixth


def make_rival_sweep(root: Path, rungs) -> Path:
    """GRUs and transformers; rungs: [(model, family, parameters, stateful bpc, its s.e., train_seconds)]."""
    sweep = root / "rivals"
    sweep.mkdir(parents=True)
    for num, (model, family, parameters, stateful, se, seconds) in enumerate(rungs):
        values = summary(model, "char", parameters, stateful, 3.78, 3.58) | {
            "family": family, "stateful_bpc_se": se, "train_seconds": seconds}
        make_job(sweep, num, model, cell=family, summary=values)
    return sweep


@pytest.mark.parametrize("alpha_transformer, beta_transformer, verdict", [
    (2.3300, 2.1100, "supported"),  # the GRU better at one size, tied at the other
    (2.3000, 2.0000, "partly supported"),  # tied at α, the transformer better at β
    (2.2000, 2.0000, "contradicted"),  # the transformer better at both
])
def test_the_seventh_finding_pairs_sizes_and_follows_the_numbers(tmp_path, alpha_transformer, beta_transformer,
                                                                 verdict):
    sweep = make_rival_sweep(tmp_path, [
        ("astra_alpha", "gru", 86_913, 2.3078, 0.0050, 207.0), ("transformer", "transformer", 84_880,
                                                                  alpha_transformer, 0.0060, 300.0),
        ("astra_beta", "gru", 715_713, 2.0958, 0.0045, 2076.0), ("transformer_beta", "transformer", 715_440,
                                                                  beta_transformer, 0.0055, 1500.0),
        ("astra_gamma", "gru", 4_383_041, 1.9, 0.004, 9000.0)])  # no transformer of its size: not judged
    line = finding_line(build_report(sweep).files["report.md"].read_text(), "GRUs remain competitive with transformers")
    assert line.split("**: ", 1)[1].startswith(f"{verdict}.")
    se = (0.0050 ** 2 + 0.0060 ** 2) ** 0.5
    assert (f"astra_alpha (86,913 parameters; no recipe) 2.3078 in 3.5 min of training against transformer "
            f"(84,880; no recipe) {alpha_transformer:.4f} in 5.0 min: "
            f"GRU - transformer {2.3078 - alpha_transformer:+.4f} ± {se:.4f}") in line
    assert "astra_gamma" not in line and "of 2 sizes" in line
