"""tools/dynamic_study.py: the run folders it finds (and the one line for a folder without one), its tables and its
plot from a results record, and the whole tool on a tiny trained run (slow)."""

from __future__ import annotations

import json
import sys

import pytest
from robustness_helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
import dynamic_study  # noqa: E402


def gain(bpc):
    return {"bpc": bpc, "se": 0.001, "targets": 100}


RESULTS = {"machine": "test", "seconds": 1.0, "groups": {"astra_alpha on tiny": {
    "tuning": {"run": "r1", "chosen": {"rule": "sgd", "lr": 0.01, "decay": 0.0, "segment": 32}},
    "runs": [{"seed": 1, "stateful_bpc": 2.3, "dynamic_bpc": 2.1, "gain": gain(-0.2),
              "cache": {"by_size": {"128": {"cache_gain": -0.03, "cache_dynamic_gain": -0.2, "additive": -0.23},
                                    "4096": {"cache_gain": -0.2, "cache_dynamic_gain": -0.25, "additive": -0.4}}},
              "by_reach": {"128": gain(-0.01), "512": gain(-0.05), "4096": gain(-0.15), "None": gain(-0.2)},
              "by_params": {"all": gain(-0.2), "head": gain(-0.17), "recurrence": None},
              "swapped": {"settings": {"rule": "sgd"}, "gain": gain(-0.08)}},
             {"seed": 2, "stateful_bpc": 2.31, "diverged": True}]}}}


def test_the_tables_and_the_plot_from_a_record(tmp_path):
    table = dynamic_study.markdown(RESULTS)
    assert "| 1 | 2.3000 | 2.1000 | -0.2000 ± 0.0010 | -0.2000 | -0.2500 | -0.4000 |" in table
    assert "| 2 | 2.3100 | diverged |" in table
    assert "| 128 | -0.0100 | -0.0300 |" in table and "| never | -0.2000 |  |" in table
    assert "head -0.1700" in table and "Halves swapped" in table
    dynamic_study.plot(RESULTS, tmp_path / "reach.png")
    assert (tmp_path / "reach.png").stat().st_size > 1000


def test_folders_without_a_completed_run_are_one_line_each(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert dynamic_study.main([str(tmp_path / "empty"), str(tmp_path / "missing")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("no completed run folder" in line for line in lines)


@pytest.mark.slow
def test_the_tool_on_a_tiny_trained_run(tmp_path, tiny_corpus):
    import gru_experiments

    summary = gru_experiments.train(["preset=smoke", "logger=none", "trainer.max_steps=4", f"data.path={tiny_corpus}",
                                     "evaluation.text.samples=0"], root=tmp_path / "root")
    out = tmp_path / "study"
    assert dynamic_study.main([summary["run_dir"], "--quick", "--out", str(out), "--cache-every", "1"]) == 0
    record = json.loads((out / "dynamic_study.json").read_text())
    [(key, group)] = record["groups"].items()
    assert key == f"astra_alpha on {tiny_corpus.name}"  # grouped by the text each run read, not a corpus assumed
    [run] = group["runs"]
    assert group["tuning"]["chosen"]["rule"] in ("sgd", "rms") and "gain" in run and "by_reach" in run
    assert "swapped" in run and (out / "dynamic_study.md").is_file() and (out / "gain_by_reach.png").is_file()

    # A seed trained since: --extend studies it alone, with the first study's tuned values, and keeps the rest.
    second = gru_experiments.train(["preset=smoke", "logger=none", "trainer.max_steps=4", "seed=2",
                                    f"data.path={tiny_corpus}", "evaluation.text.samples=0"], root=tmp_path / "root")
    more = tmp_path / "more"
    assert dynamic_study.main([summary["run_dir"], second["run_dir"], "--quick", "--no-swap", "--out", str(more),
                               "--cache-every", "1", "--extend", str(out / "dynamic_study.json")]) == 0
    extended = json.loads((more / "dynamic_study.json").read_text())["groups"][key]
    assert extended["tuning"] == group["tuning"] and extended["runs"][0] == run
    assert [r["seed"] for r in extended["runs"]] == [run["seed"], 2] and extended["runs"][1]["settings"] == \
        group["tuning"]["chosen"] and "by_reach" in extended["runs"][1] and "swapped" not in extended["runs"][1]
    assert dynamic_study.main([summary["run_dir"], "--extend", str(tmp_path / "none.json")]) == 2


def dynamic_settings(tmp_path, gains, model="astra_alpha", corpus=None):
    from omegaconf import OmegaConf
    from test_findings import summary
    from test_report import make_job

    from gru_experiments.report.seed_groups import group_settings
    from gru_experiments.report.sweep_folder import collect

    sweep = tmp_path / f"dyn{len(list(tmp_path.iterdir()))}"
    for num, (seed, gain) in enumerate(enumerate(gains, 1)):
        values = summary(model, "char", 86_913, 2.25, 3.7, 3.58)
        values.update(dynamic_bpc=2.25 + gain, dynamic_bpc_se=0.0, dynamic_gain_bpc=gain, dynamic_gain_se=0.002,
                      cache_gain_bpc=-0.2, cache_gain_se=0.01, recurrent=True,
                      dynamic={"settings": {"rule": "sgd", "lr": 0.01, "decay": 0.0, "segment": 32,
                                            "reset_every": None, "params": "all"}, "diverged": False})
        job = make_job(sweep, num, model, summary=values)
        config = OmegaConf.load(job / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.merge(config, {"seed": seed}), job / ".hydra" / "config.yaml")
    runs, _ = collect(sweep)
    return group_settings(runs), sweep


def test_the_weights_finding_and_the_section_follow_the_numbers(tmp_path):
    from gru_experiments.report.dynamic import dynamic_section, weights_finding

    jobs, _ = dynamic_settings(tmp_path, [-0.07, -0.075, -0.072])
    verdict, evidence = weights_finding(jobs)
    assert verdict == "supported" and "-0.0723 ± 0.0015" in evidence and "36% of the cache's" in evidence
    assert weights_finding(dynamic_settings(tmp_path, [-0.03, 0.02, -0.004])[0])[0] == "not shown by this sweep"
    assert weights_finding(dynamic_settings(tmp_path, [0.05, 0.06, 0.055])[0])[0] == "contradicted"
    lines = "\n".join(dynamic_section(jobs, {}))
    assert "## Dynamic evaluation" in lines and "sgd, η 0.01, λ 0, segment 32" in lines
    assert weights_finding([])[0] == "cannot be judged"


def test_the_weights_finding_is_numbered_on_after_the_findings_before_it(tmp_path):
    from conftest import finding_line

    from gru_experiments.report.report import SECTIONS, build_report, finding_number

    _, sweep = dynamic_settings(tmp_path, [-0.07, -0.075, -0.072])
    build_report(sweep)
    text = (sweep / "report.md").read_text()
    claim = "The weights read what the state does not"
    assert finding_line(text, claim).split("**: ", 1)[1].startswith("supported.") and "## Dynamic evaluation" in text
    assert finding_number(claim) > len(SECTIONS[0].findings.rules if SECTIONS[0].findings else ())  # numbered on
