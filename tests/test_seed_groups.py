"""Verdicts over trainings: runs that differ in their seed alone are one setting (its means, its spread between
trainings), the one rule that tells two figures apart (significance.py), sweep.py's seeds=N and the W&B job_type
that a setting's runs share."""

from __future__ import annotations

import csv
import json
import math
from statistics import fmean, stdev

import pytest
from omegaconf import OmegaConf
from test_findings import finding_lines, summary
from test_report import assert_valid_png, make_job
from wandb_records import offline_runs

import sweep as sweep_script
from gru_experiments.errors import UserError
from gru_experiments.report.plots import PLOT_BPC, PLOT_CONTEXT, context_curve_series
from gru_experiments.report.report import build_report
from gru_experiments.report.section import Findings
from gru_experiments.report.significance import difference, recording, rests_on
from gru_experiments.report.sweep_folder import JobResult

# model -> stateful bpc of its trainings with seeds 1, 2, 3
STATEFUL = {"astra_alpha": [2.30, 2.32, 2.37], "mingru": [2.40, 2.38, 2.45]}


def seeded_job(sweep, num, model, seed, stateful, config=None):
    job = make_job(sweep, num, model, summary=summary(model, "char", 86_913, stateful, 3.7, 3.58))
    cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.merge(cfg, {"seed": seed, **(config or {})}), job / ".hydra" / "config.yaml")
    return job


@pytest.fixture
def seed_sweep(tmp_path):
    """Two models, three seeds each, launched model-major as Hydra's multirun does."""
    sweep = tmp_path / "seeds"
    for i, (model, values) in enumerate(STATEFUL.items()):
        for j, stateful in enumerate(values):
            seeded_job(sweep, 3 * i + j, model, j + 1, stateful)
    return sweep


def rows_of(sweep):
    with open(sweep / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_setting_is_its_runs_mean_and_spread_and_models_are_never_pooled(seed_sweep):
    report = build_report(seed_sweep)
    assert [(job.name, job.n) for job in report.settings] == [("astra_alpha", 3), ("mingru", 3)]
    settings = [row for row in rows_of(seed_sweep) if row["row"] == "setting"]
    assert [(row["model"], row["n"]) for row in settings] == [("astra_alpha", "3"), ("mingru", "3")]
    for row in settings:
        values = STATEFUL[row["model"]]
        assert float(row["stateful_bpc"]) == pytest.approx(fmean(values))
        assert float(row["stateful_bpc_sd"]) == pytest.approx(stdev(values))
    runs = [row for row in rows_of(seed_sweep) if row["row"] == "run"]
    assert [(row["model"], row["seed"], float(row["stateful_bpc"])) for row in runs] == [
        (model, str(seed), value) for model, values in STATEFUL.items() for seed, value in enumerate(values, 1)]
    text = (seed_sweep / "report.md").read_text()
    results = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    mean, sd = fmean(STATEFUL["astra_alpha"]), stdev(STATEFUL["astra_alpha"])
    assert sum(line.startswith("| astra_alpha |") for line in results.splitlines()) == 1
    assert f"| {mean:.4f} ± {sd:.4f} |" in results and results.rstrip().endswith("| completed | 3 |")
    assert all("Rests on" in line for line in finding_lines(text) if "cannot be judged" not in line)
    # The plots draw the spread: the context curve's band is the sd between trainings at each context.
    band = dict(context_curve_series(report.settings)["astra_alpha"]["band"])
    assert band[8] == pytest.approx(stdev([value + 0.02 for value in STATEFUL["astra_alpha"]]))
    for name in (PLOT_CONTEXT, PLOT_BPC):
        assert_valid_png(report.files[name])


def test_each_findings_verdict_from_each_seed_alone_beside_its_verdict_over_seeds(seed_sweep, tmp_path):
    text = build_report(seed_sweep).files["report.md"].read_text()
    verdicts = text.split("## Verdicts over trainings", 1)[1].split("\n## ", 1)[0]
    assert "| # | finding | seed 1 alone | seed 2 alone | seed 3 alone | over seeds | changes |" in verdicts
    assert ("| 2 | A GRU without carried state is functionally non-recurrent | supported | supported | supported |"
            in verdicts)
    single = tmp_path / "single"
    seeded_job(single, 0, "astra_alpha", 1, 2.30)
    assert "## Verdicts over trainings" not in build_report(single).files["report.md"].read_text()


def test_sweeps_run_side_by_side_are_reported_together(tmp_path, capsys):
    """Two lanes, each its own sweep folder (multirun.yaml), one parent: report=PARENT makes one setting of them."""
    parent = tmp_path / "study"
    for lane, seeds in (("lane_a", (1, 2)), ("lane_b", (3,))):
        for num, seed in enumerate(seeds):
            seeded_job(parent / lane, num, "astra_alpha", seed, STATEFUL["astra_alpha"][seed - 1])
        OmegaConf.save({"hydra": {"overrides": {"task": ["model=astra_alpha"]}}}, parent / lane / "multirun.yaml")
    assert sweep_script.main([f"report={parent}"]) == 0
    [setting] = [row for row in rows_of(parent) if row["row"] == "setting"]
    assert setting["n"] == "3" and float(setting["stateful_bpc"]) == pytest.approx(fmean(STATEFUL["astra_alpha"]))


def test_the_seed_tells_runs_apart_and_a_repeated_seed_is_not_a_second_training(tmp_path):
    sweep = tmp_path / "repeat"
    seeded_job(sweep, 0, "astra_alpha", 1, 2.30)
    seeded_job(sweep, 1, "astra_alpha", 1, 2.40)  # the same seed again: not one setting of two trainings
    seeded_job(sweep, 2, "astra_alpha", 2, 2.35, config={"model": {"lr": 0.02}})  # another config: another setting
    report = build_report(sweep)
    assert [job.n for job in report.settings] == [1, 1, 1]
    assert [row["row"] for row in rows_of(sweep)] == ["setting"] * 3


def sides(a, b):
    return dict(enumerate(a, 1)), (None if b is None else dict(enumerate(b, 1)))


def test_one_rule_paired_by_seed_between_trainings_within_run_for_one_each():
    # Paired by seed: each training's gap is -0.02, so the spread of the gaps is nil and the gap shown.
    a, b = sides([(2.30, 0.001), (2.40, 0.001), (2.35, 0.001)], [(2.32, 0.001), (2.42, 0.001), (2.37, 0.001)])
    paired = difference(a, b)
    assert paired.paired and paired.value == pytest.approx(-0.02) and paired.se == pytest.approx(0.0, abs=1e-12)
    assert paired.below and paired.over_seeds
    # No shared seeds: the two means' between-training errors; the within-run errors play no part.
    unpaired = difference(a, {seed + 10: value for seed, value in b.items()})
    assert not unpaired.paired and not unpaired.shown
    assert unpaired.se == pytest.approx(math.hypot(stdev([2.30, 2.40, 2.35]) / 3 ** 0.5,
                                                   stdev([2.32, 2.42, 2.37]) / 3 ** 0.5))
    # One training a side: today's within-run rule, the hypot of the two figures' own errors.
    single = difference({1: (2.30, 0.003)}, {1: (2.32, 0.004)})
    assert single.se == pytest.approx(0.005) and single.below and not single.over_seeds
    # Against zero, with the least difference worth having.
    assert not difference({1: (-0.004, 0.0001)}, worth=0.005).below
    assert difference({1: (-0.006, 0.0001)}, worth=0.005).below


def test_trainings_that_disagree_hide_a_gap_the_within_run_error_would_show():
    a, b = sides([(2.30, 0.001), (2.45, 0.001), (2.31, 0.001)], [(2.35, 0.001), (2.33, 0.001), (2.40, 0.001)])
    assert not difference(a, b).shown  # -0.0067 ± 0.06 between trainings
    assert difference({1: a[1]}, {1: b[1]}).below  # -0.05 ± 0.0014 within one training each


def test_every_finding_says_what_it_rests_on():
    group = Findings("test", "")

    @group.claim("a gap")
    def _(jobs):
        difference({1: (1.0, 0.1), 2: (1.2, 0.1)}, {1: (0.9, 0.1), 2: (1.0, 0.1)})
        return "supported", "Evidence."

    @group.claim("counts")
    def _(jobs):
        return "supported", "Counted."

    jobs = [JobResult("0_a", "completed", {"model": "a"})]
    first, second = group.judge(jobs)
    assert first.evidence.startswith("Evidence. Rests on 2 trainings a side (1 comparisons; 1 paired by seed")
    assert second.evidence == "Counted. Rests on one training each."
    with recording() as used:
        difference({1: (1.0, 0.1)}, {1: (0.9, 0.1)})
    assert rests_on(used, jobs).startswith("Rests on one training each")
    with recording() as used:
        difference({1: (1.0, 0.1)}, {1: (0.9, 0.1)})
        difference({1: (1.0, 0.1), 2: (1.1, 0.1)}, {1: (0.9, 0.1), 2: (1.0, 0.1)})
    assert rests_on(used, jobs).startswith("Rests on 2 trainings a side in 1 of 2 comparisons")
    assert rests_on([], [JobResult("0_a", "failed", {"model": "a"})]) == ""  # no completed run: nothing to say


def test_a_settings_mean_goes_element_by_element_and_keeps_what_is_no_number():
    """settings.mean_of through a record's lists (the recall points: [distance, accuracy] pairs) and tuples; what
    does not average (text, lists of another length) is the first training's."""
    from gru_experiments.report.seed_groups import mean_of

    points = [[[8, 0.5], [16, 0.25]], [[8, 0.75], [16, 0.25]]]
    assert mean_of(points) == [[8, 0.625], [16, 0.25]]
    assert mean_of([(1.0, "gru"), (2.0, "gru")]) == (1.5, "gru")
    assert mean_of([{"curve": [1.0, 2.0], "note": "a"}, {"curve": [3.0, 4.0], "note": "b"}]) == \
        {"curve": [2.0, 3.0], "note": "a"}
    assert mean_of([[1.0, 2.0], [3.0]]) == [1.0, 2.0]


def test_seeds_is_the_seed_sweep():
    _, overrides = sweep_script.parse_arguments(["models=[astra_alpha,mingru]", "seeds=3", "preset=smoke"])
    assert overrides == ["preset=smoke", "seed=1,2,3"]
    for argv, match in ((["seeds=0"], "whole number"), (["seeds=abc"], "whole number"),
                        (["seeds=2", "seed=5,6"], "both choose the seeds"),
                        (["seeds=100000"], r"^seeds=100000: at most 100 trainings of each setting")):
        with pytest.raises(UserError, match=match):
            sweep_script.parse_arguments(argv)


@pytest.mark.slow
def test_a_seed_sweep_reports_each_model_once_over_its_seeds_and_wb_groups_them(tiny_corpus, data_dir, tmp_path):
    from test_sweep import run_script, tiny_overrides

    sweep = tmp_path / "seeds"
    result = run_script("sweep.py", "models=[astra_alpha,mingru]", "seeds=3", "logger=wandb",
                        *tiny_overrides(tiny_corpus, data_dir), f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    rows = rows_of(sweep)
    settings = [row for row in rows if row["row"] == "setting"]
    assert [(row["model"], row["n"]) for row in settings] == [("astra_alpha", "3"), ("mingru", "3")]
    for row in settings:
        runs = [float(r["stateful_bpc"]) for r in rows if r["row"] == "run" and r["model"] == row["model"]]
        assert len(runs) == 3 and len(set(runs)) == 3  # three trainings, each its own
        assert float(row["stateful_bpc"]) == pytest.approx(fmean(runs))
        assert float(row["stateful_bpc_sd"]) == pytest.approx(stdev(runs))
    assert all("Rests on" in line for line in finding_lines((sweep / "report.md").read_text())
               if "cannot be judged" not in line)
    runs = [run for job in sorted(sweep.glob("*_*/")) for run in offline_runs(job)]  # each job's own W&B run
    by_type: dict[str, list] = {}
    for run in runs:  # the job type: the job's overrides but the seed (at most 64 characters, hashed past 55)
        by_type.setdefault(run.job_type, []).append(run.config["seed"])
    assert len(by_type) == 2 and all(sorted(seeds) == [1, 2, 3] for seeds in by_type.values())
    assert sorted(job_type.split(",")[0] for job_type in by_type) == ["model=astra_alpha", "model=mingru"]
    assert len({run.group for run in runs}) == 1


def test_a_run_resumed_on_another_machine_is_still_a_training_of_its_setting(tmp_path):
    sweep = tmp_path / "resumed"
    for seed, stateful in enumerate(STATEFUL["astra_alpha"], 1):  # seed 3 trained on a GPU, the others anywhere
        seeded_job(sweep, seed - 1, "astra_alpha", seed, stateful,
                   config={"trainer": {"accelerator": "gpu" if seed == 3 else "auto", "max_steps": -1}})
    # seed 1 resumed on the CPU: its newest record is the resume's own command (resume=, no progress bar)
    job = sweep / "0_astra_alpha"
    record = job / ".hydra" / "resumed_2026-11-28_05-18-00_000000"
    record.mkdir()
    resumed = {"resume": str(job), "trainer": {"accelerator": "cpu", "enable_progress_bar": False}}
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(job / ".hydra" / "config.yaml"), resumed), record / "config.yaml")
    assert [(setting.name, setting.n) for setting in build_report(sweep).settings] == [("astra_alpha", 3)]
    # what it trained still tells settings apart
    seeded_job(sweep, 3, "astra_alpha", 4, 2.31, config={"trainer": {"accelerator": "auto", "max_steps": 500}})
    assert [setting.n for setting in build_report(sweep).settings] == [3, 1]


def test_a_settings_text_table_names_each_trainings_seed(tmp_path):
    from test_controls_report import text_record  # a text record of 12 samples, its settings' seed 0

    sweep = tmp_path / "text_seeds"
    for seed, stateful in enumerate(STATEFUL["astra_alpha"], 1):
        job = seeded_job(sweep, seed - 1, "astra_alpha", seed, stateful)
        record = text_record()
        record["settings"]["seed"] = seed
        values = json.loads((job / "summary.json").read_text()) | {"text": record}
        (job / "summary.json").write_text(json.dumps(values))
    text = build_report(sweep).files["report.md"].read_text()
    assert "12 samples of 300 characters per setting, seeds 1, 2, 3; windowed: the last 128 tokens" in text


def test_wandbs_job_type_leaves_out_how_a_run_ran_as_the_report_does(monkeypatch):
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    from gru_experiments.runs import loggers

    overrides = ["model=mingru", "seed=2", "trainer.accelerator=gpu", "logger=wandb",
                 "+trainer.enable_progress_bar=false", "model.lr=0.02", "trainer.max_steps=500"]
    monkeypatch.setattr(loggers, "multirun_sweep_dir", lambda: "/tmp/sweep")
    hydra = SimpleNamespace(overrides=SimpleNamespace(task=overrides))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra))
    assert loggers.setting_name() == "model=mingru,model.lr=0.02,trainer.max_steps=500"


@pytest.mark.parametrize("damage", ["cut", "empty", "missing"])
def test_a_seed_whose_summary_is_damaged_is_named_not_completed_and_forms_no_setting(tmp_path, capsys, damage):
    """Issue 72: one seed's summary.json cut off, empty or missing made that job a setting of its own
    ("astra_alpha (window None)", n = 1) beside its setting's other seeds."""
    sweep = tmp_path / "seeds"
    for j, stateful in enumerate(STATEFUL["astra_alpha"]):
        seeded_job(sweep, j, "astra_alpha", j + 1, stateful, config={"data": {"seq_len": 32}})
    OmegaConf.save({"hydra": {"overrides": {"task": ["model=astra_alpha", "seed=1,2,3"]}}}, sweep / "multirun.yaml")
    summary_file = sweep / "2_astra_alpha" / "summary.json"
    if damage == "missing":
        summary_file.unlink()
    else:
        summary_file.write_text("" if damage == "empty" else summary_file.read_text()[:40])
    assert sweep_script.main([f"report={sweep}"]) == 0
    rows = rows_of(sweep)
    assert [(row["model"], row["status"], row["n"], row["row"]) for row in rows] == [
        ("astra_alpha", "completed", "2", "setting"), ("astra_alpha", "completed", "1", "run"),
        ("astra_alpha", "completed", "1", "run"), ("astra_alpha", "incomplete", "", "setting")]
    assert "not every job completed: astra_alpha (incomplete, 2_astra_alpha)" in capsys.readouterr().err
    missing = (sweep / "report.md").read_text().split("## What is missing")[1].split("\n## ")[0]
    assert "**astra_alpha** (`2_astra_alpha`): its summary" in missing or (
        "**astra_alpha** has no summary yet (`2_astra_alpha`)" in missing)
    assert "window" not in missing and "Nothing: every job completed" not in missing


def test_a_seed_whose_folder_is_gone_is_named_missing_with_its_folder(seed_sweep, capsys):
    """Issue 72: with one seed's folder deleted the report said "Nothing: every job completed"."""
    import shutil

    OmegaConf.save({"hydra": {"overrides": {"task": ["model=astra_alpha,mingru", "seed=1,2,3"]}}},
                   seed_sweep / "multirun.yaml")
    shutil.rmtree(seed_sweep / "4_mingru")
    assert sweep_script.main([f"report={seed_sweep}"]) == 0
    assert "not every job completed: mingru (missing, 4_mingru)" in capsys.readouterr().err
    missing = (seed_sweep / "report.md").read_text().split("## What is missing")[1].split("\n## ")[0]
    assert "**mingru** was planned but never started (`model=mingru seed=2`), or its folder `4_mingru` was removed" \
        in missing
    assert [(row["model"], row["status"], row["n"]) for row in rows_of(seed_sweep) if row["row"] == "setting"] == [
        ("astra_alpha", "completed", "3"), ("mingru", "completed", "2"), ("mingru", "missing", "")]
