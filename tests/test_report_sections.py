"""The report as a registry of sections: a section registered from a test file alone, with no change to
any package file, reaches results.csv and report.md (its columns, its markdown, its plot, its findings,
numbered on)."""

from __future__ import annotations

import csv

import pytest
from test_findings import make_sweep

from gru_experiments.report import report
from gru_experiments.report.report import SECTIONS, build_report, register_section, unregister_section
from gru_experiments.report.section import Findings, Section
from gru_experiments.report.sweep_folder import JobResult, mode_pairs

NAME = "parameters per bit"
DEMO = Findings("Findings on the demonstration", "What the registered section claims.")


@DEMO.claim("Every model has parameters")
def _every_model_has_parameters(jobs):
    counted = sum(job.number("parameters") is not None for job in jobs)
    return ("supported" if counted == len(jobs) else "contradicted"), f"{counted} of {len(jobs)} models."


def _markdown(jobs, plots):
    rows = [f"- {job.model}: {job.number('parameters') / job.number('stateful_bpc'):,.0f}"
            for job in jobs if job.status == "completed"]
    return ["## Parameters per bit", "", *rows, "", "![parameters per bit](demo.png)" if "demo.png" in plots
            else "no demo plot", ""]


def _plot(jobs, path):
    path.write_bytes(b"not really a png")
    return path


@pytest.fixture
def demo_section():
    """A section registered for one test and taken out after it, whatever the test does."""
    before = list(SECTIONS)
    section = register_section(Section(NAME, _markdown, findings=DEMO, plots={"demo.png": _plot}, columns={
        "parameters_per_bit": lambda job: job.number("parameters") / job.number("stateful_bpc")}))
    yield section
    unregister_section(NAME)
    assert SECTIONS == before


def test_a_section_registered_from_a_test_reaches_results_csv_and_report_md(tmp_path, demo_section):
    built = build_report(make_sweep(tmp_path))
    rows = list(csv.DictReader(built.files["results.csv"].open()))
    assert "parameters_per_bit" in list(rows[0])[:-2] and list(rows[0])[-2:] == ["error", "run_dir"]
    assert float(rows[0]["parameters_per_bit"]) == pytest.approx(86_913 / 2.31)
    text = built.files["report.md"].read_text()
    assert "## Parameters per bit\n\n- astra_alpha: 37,625\n" in text
    assert "![parameters per bit](demo.png)" in text and (tmp_path / "study" / "demo.png").is_file()
    findings = text.split("## Findings on the demonstration", 1)[1]
    number = 1 + sum(len(section.findings.rules) for section in SECTIONS[:-1] if section.findings)  # numbered on
    assert f"{number}. **Every model has parameters**: supported. 3 of 3 models." in findings
    assert text.index("## Parameters per bit") > text.index("## Samples")  # appended: after the last section


def test_a_section_goes_where_it_is_registered_and_leaves_no_trace(tmp_path):
    sweep = make_sweep(tmp_path)
    plain = build_report(sweep).files["report.md"].read_text()
    register_section(Section(NAME, lambda jobs, plots: ["## Early", ""]), before="findings")
    try:
        text = build_report(sweep).files["report.md"].read_text()
        assert text.index("## Early") < text.index("## Findings")
    finally:
        unregister_section(NAME)
    assert build_report(sweep).files["report.md"].read_text() == plain
    assert NAME not in [section.name for section in report.SECTIONS]
    for taken in (Section("samples", lambda jobs, plots: []), Section(NAME, list, columns={"val_bpc": float})):
        with pytest.raises(ValueError, match="is taken"):  # a name to unregister by, a column, once each
            register_section(taken)


def test_one_pairing_of_a_models_training_modes():
    def job(num, model, mode, window):
        return JobResult(f"{num}_{model}", "completed", {"model": model, "training_mode": mode, "seq_len": window})
    jobs = [job(0, "a", "windows", 128), job(1, "a", "windows", 128), job(2, "a", "streams", 128),
            job(3, "a", "windows", 512), job(4, "b", "streams", 128), job(5, "b", "windows", 128)]
    assert [(w.job, s.job) for w, s in mode_pairs(jobs)] == [("1_a", "2_a"), ("5_b", "4_b")]  # twins: the later


def test_a_claim_inserted_first_moves_every_finding_by_one(tmp_path):
    """Findings are numbered by position alone: a claim registered before all the others takes number 1, and each
    other finding's line in report.md keeps its text under the next number."""
    sweep = make_sweep(tmp_path)
    claims = [claim for section in SECTIONS if section.findings for claim in section.findings.rules]
    before = {claim: report.finding_number(claim) for claim in claims}
    plain = build_report(sweep).files["report.md"].read_text()
    register_section(Section(NAME, lambda jobs, plots: [], findings=DEMO), before=SECTIONS[0].name)
    try:
        text = build_report(sweep).files["report.md"].read_text()
        assert report.finding_number("Every model has parameters") == 1
        assert {claim: report.finding_number(claim) for claim in claims} == {c: n + 1 for c, n in before.items()}
        for claim, number in before.items():
            old = next(line for line in plain.splitlines() if line.startswith(f"{number}. **{claim}**: "))
            assert f"{number + 1}. **{claim}**: {old.split('**: ', 1)[1]}" in text.splitlines()
    finally:
        unregister_section(NAME)
