"""The report's side of the generated-text statistics (summary.json's "text"), the planted-recall control
("recall") and the context curve by class of target (context_curve.by_class): tables, results.csv
columns, figures and findings, over fabricated sweep folders (nothing is trained here)."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest
from conftest import finding_line
from test_findings import make_sweep, summary
from test_report import assert_valid_png, make_job

from gru_experiments.report.context_classes import PLOT_CLASSES
from gru_experiments.report.recall import PLOT_RECALL, RECALL
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import collect
from gru_experiments.report.text import PLOT_TEXT, TEXT

DECODERS = ("greedy", "temperature_0.8", "top_k_30", "top_p_0.9", "pure")
STATISTICS = ("word_validity", "seq_rep_4", "loop_rate", "distinct_2", "copy_32", "line_shape", "reference_bpc")
BASE = {"word_validity": (0.85, 0.02), "seq_rep_4": (0.05, 0.01), "loop_rate": (0.0, 0.0), "distinct_2": (0.9, 0.01),
        "copy_32": (0.01, 0.005), "line_shape": (0.10, 0.03), "reference_bpc": (2.4, 0.05)}


def statistics(**changes) -> dict:
    """{statistic: {"value", "se"}}: BASE with `changes` ({statistic: (value, se)})."""
    return {name: {"value": v, "se": se} for name, (v, se) in (BASE | changes).items()}


def text_record(stateful=(0.90, 0.01), stateless=(0.30, 0.02), greedy_loops=(1.0, 0.9, 0.75),
                line_shapes=((0.08, 0.02), (0.35, 0.03)), copy=(0.01, 0.005), drift=True) -> dict:
    """A summary's text record: the figures the findings read are the arguments, the rest BASE."""
    modes = {mode: {decoder: statistics() for decoder in DECODERS} for mode in ("stateful", "windowed", "stateless")}
    for mode, loop in zip(modes, greedy_loops):
        modes[mode]["greedy"] = statistics(loop_rate=(loop, 0.1), seq_rep_4=(0.6, 0.05))
    modes["stateful"]["temperature_0.8"] = statistics(word_validity=stateful, line_shape=line_shapes[0],
                                                      copy_32=copy)
    modes["stateless"]["temperature_0.8"] = statistics(word_validity=stateless, line_shape=line_shapes[1])
    stretches = {mode: [{"start": k * 500, "end": (k + 1) * 500, "statistics": statistics(word_validity=(wv, 0.02))}
                        for k, wv in enumerate(values)] for mode, values in (("stateful", (0.90, 0.89, 0.88)),
                                                                            ("windowed", (0.80, 0.60, 0.50)))}
    return {"settings": {"samples": 12, "chars": 300, "window": 128, "seed": 0, "drift_samples": 2,
                         "drift_chars": 1500, "stretch_chars": 500, "drift_decoder": "pure"},
            "modes": modes, "seconds": 42.0, "drift": stretches if drift else {},
            "reference": statistics(word_validity=(0.937, 0.009), loop_rate=(0.0, 0.0), copy_32=(0.0, 0.0),
                                    line_shape=(0.046, 0.032)),
            "floor": statistics(word_validity=(0.081, 0.007), line_shape=(0.408, 0.024)),
            "ceiling": statistics(word_validity=(1.0, 0.0), loop_rate=(1.0, 0.0), line_shape=(1.0, 0.0))}


def word_validity_history(first_stateful: float, last_stateless: float) -> list[tuple]:
    return [(10, 0, "train/loss", 3.9), (200, 0, "val/stateful_word_validity", first_stateful),
            (200, 0, "val/stateless_word_validity", 0.10), (2000, 1, "val/stateful_word_validity", 0.93),
            (2000, 1, "val/stateless_word_validity", last_stateless)]


def make_text_sweep(root: Path, leviathan_copy=(0.25, 0.03), history=(0.60, 0.31), **record) -> Path:
    """astra_alpha (87k parameters) and leviathan (12M), both with a text record."""
    sweep = root / "text"
    for num, (model, parameters, copy) in enumerate((("astra_alpha", 86_913, (0.01, 0.005)),
                                                     ("leviathan", 12_000_000, leviathan_copy))):
        values = summary(model, "char", parameters, 2.31, 3.78, 3.58) | {
            "text": text_record(copy=copy, **record)}
        make_job(sweep, num, model, summary=values, history=word_validity_history(*history))
    return sweep


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def numbered_lines(text: str, title: str) -> list[str]:
    return [line for line in section(text, title).splitlines() if re.match(r"\d+\. ", line)]


def read_rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {row["job"]: row for row in csv.DictReader(f)}


# --- the generated text -----------------------------------------------------------------------------------
def test_the_text_table_columns_and_figure(tmp_path):
    sweep = make_text_sweep(tmp_path)
    report = build_report(sweep)
    assert_valid_png(report.files[PLOT_TEXT])
    text = report.files["report.md"].read_text()
    table = section(text, "Generated text")
    assert "### astra_alpha" in table and "### leviathan" in table
    assert "12 samples of 300 characters per setting, seed 0; windowed: the last 128 tokens; measured in 42 s." in table
    assert "| setting | " + " | ".join(STATISTICS) + " |" in table
    assert ("| stateful, temperature_0.8 | 0.900 ± 0.010 | 0.050 ± 0.010 | 0.000 ± 0.000 | 0.900 ± 0.010 | "
            "0.010 ± 0.005 | 0.080 ± 0.020 | 2.400 ± 0.050 |") in table
    assert "| stateless, greedy | 0.850 ± 0.020 | 0.600 ± 0.050 | 0.750 ± 0.100 |" in table
    assert "| reference (validation) | 0.937 ± 0.009 |" in table and "| random (floor) | 0.081 ± 0.007 |" in table
    assert "| looped (ceiling) | 1.000 ± 0.000 |" in table
    rows = [line for line in table.splitlines() if line.startswith("| stateful, ") or line.startswith("| windowed, ")
            or line.startswith("| stateless, ")]
    assert len(rows) == 2 * 15  # two runs, 3 modes x 5 decoders
    # the drift: a stretch per row, each mode's word_validity, reference_bpc and seq_rep_4
    assert ("| characters | stateful word_validity | stateful reference_bpc | stateful seq_rep_4 | "
            "windowed word_validity") in table
    assert "| 500–1000 | 0.890 ± 0.020 | 2.400 ± 0.050 | 0.050 ± 0.010 | 0.600 ± 0.020 |" in table
    assert f"]({PLOT_TEXT})" in table
    rows = read_rows(sweep / "results.csv")
    alpha = rows["0_astra_alpha"]
    assert float(alpha["text_stateful_word_validity"]) == 0.90 and float(alpha["text_stateless_word_validity"]) == 0.30
    assert float(alpha["text_reference_word_validity"]) == 0.937
    assert float(alpha["text_stateful_greedy_loop_rate"]) == 1.0
    assert float(alpha["text_stateless_greedy_loop_rate"]) == 0.75
    assert float(rows["1_leviathan"]["text_stateful_copy_32"]) == 0.25


def test_the_text_findings_state_their_figures_and_rules(tmp_path):
    text = build_report(make_text_sweep(tmp_path)).files["report.md"].read_text()
    lines = numbered_lines(text, "Findings on the generated text")
    assert [line.split(". **", 1)[0] for line in lines] == ["11", "12", "13", "14", "15"]
    assert all(f"**{claim}**" in line for claim, line in zip(TEXT.rules, lines))
    greedy, noise, shape, early, copying = lines
    assert "**: supported." in greedy and "stateful 1.000 ± 0.100, windowed 0.900 ± 0.100, stateless 0.750 ± 0.100" \
        in greedy and "at least 0.5" in greedy and "6 of 6" in greedy
    gap_se = math.hypot(0.01, 0.02)
    assert "**: supported." in noise and f"(gap +0.600 ± {gap_se:.3f})" in noise and "random floor 0.081" in noise
    limit = 0.046 + 0.05 + 2 * math.hypot(0.02, 0.032)
    assert "**: supported." in shape and f"(limit {limit:.3f}: within), stateless 0.350 ± 0.030 (beyond)" in shape
    assert "**: supported." in early and "astra_alpha 0.600 at step 200 vs 0.310 at step 2000" in early
    assert "**: supported." in copying and "leviathan (12,000,000 parameters), 0.250 ± 0.030" in copying
    assert "excess +0.250 ± 0.030" in copying and "the others: astra_alpha 0.010" in copying


@pytest.mark.parametrize("changes, index, verdict, says", [
    (dict(greedy_loops=(0.2, 0.1, 0.0)), 0, "contradicted", "0 of 6"),
    (dict(greedy_loops=(0.2, 0.9, 0.75)), 0, "partly supported", "4 of 6"),
    # stateless within two standard errors of stateful: not noise
    (dict(stateless=(0.86, 0.02)), 1, "contradicted", "0 of 2"),
    (dict(line_shapes=((0.30, 0.02), (0.35, 0.03))), 2, "contradicted", "(limit 0.171: beyond)"),
    (dict(history=(0.25, 0.31)), 3, "contradicted", "0 of 2"),
    (dict(leviathan_copy=(0.02, 0.015)), 4, "not shown by this sweep", "excess +0.020 ± 0.015"),
])
def test_the_text_findings_follow_the_numbers(tmp_path, changes, index, verdict, says):
    jobs, _ = collect(make_text_sweep(tmp_path, **changes))
    finding = TEXT.judge(jobs)[index]
    assert finding.verdict == verdict and says in finding.evidence


def test_the_text_findings_say_what_is_missing(tmp_path):
    sweep = tmp_path / "small"
    make_job(sweep, 0, "astra_alpha", summary=summary("astra_alpha", "char", 86_913, 2.31, 3.78, 3.58) | {
        "text": text_record()})  # no history.csv, no model of a million parameters
    jobs, _ = collect(sweep)
    found = TEXT.judge(jobs)
    assert [f.verdict for f in found[:3]] == ["supported"] * 3
    assert found[3].verdict == "cannot be judged" and "val/stateful_word_validity" in found[3].evidence
    assert found[4].verdict == "cannot be judged" and "at least 1,000,000 parameters" in found[4].evidence


def test_a_text_record_without_the_figures_a_finding_reads_is_passed_over(tmp_path):
    """A run whose text record holds no mode's figures (nor the reference's) leaves the first three findings to the
    runs that have them: judged on astra_alpha alone, leviathan named in none."""
    sweep = tmp_path / "bare"
    bare = text_record()
    bare["modes"], bare["reference"] = {}, {}
    make_job(sweep, 0, "astra_alpha", summary=summary("astra_alpha", "char", 86_913, 2.31, 3.78, 3.58) | {
        "text": text_record()})
    make_job(sweep, 1, "leviathan", summary=summary("leviathan", "char", 12_000_000, 2.31, 3.78, 3.58) | {
        "text": bare}, history=word_validity_history(0.60, 0.31))
    jobs, _ = collect(sweep)
    greedy, noise, shape = TEXT.judge(jobs)[:3]
    assert [greedy.verdict, noise.verdict, shape.verdict] == ["supported"] * 3
    assert "3 of 3 (model, mode) settings" in greedy.evidence and "It is for 1 of 1 models" in noise.evidence
    assert not any("leviathan" in finding.evidence for finding in (greedy, noise, shape))


# --- the planted-recall control ---------------------------------------------------------------------------
DISTANCES = (16, 48, 96, 192, 384, 768)
CHANCE = 3.0  # log2 of 8 keys
WINDOWS_128 = {"stateful": [(0.2, 0.05), (0.4, 0.06), (0.9, 0.1), (3.0, 0.05), (3.02, 0.05), (2.98, 0.05)],
               "windowed": [(0.2, 0.05), (0.45, 0.06), (3.0, 0.05), (3.0, 0.05), (3.01, 0.05), (2.99, 0.05)]}
STREAMS_128 = {"stateful": [(0.15, 0.05), (0.3, 0.05), (0.6, 0.1), (1.2, 0.1), (2.0, 0.1), (2.9, 0.08)],
               "windowed": WINDOWS_128["windowed"]}
WINDOWS_512 = {"stateful": [(0.2, 0.05), (0.3, 0.05), (0.5, 0.05), (0.8, 0.1), (1.5, 0.1), (3.0, 0.05)],
               "windowed": WINDOWS_128["windowed"]}


def recall_record(figures: dict, seq_len: int) -> dict:
    by_distance = {str(d): {mode: {"bits": bits, "se": se, "targets": 400} for mode, (bits, se) in
                            (("stateful", figures["stateful"][i]), ("windowed", figures["windowed"][i]),
                             ("stateless", (3.05, 0.04)))} for i, d in enumerate(DISTANCES)}
    return {"keys": 8, "distances": list(DISTANCES), "plantings": 400, "window": 64, "seq_len": seq_len,
            "by_distance": by_distance, "note": "keys of 8 symbols, planted by the test"}


def make_recall_sweep(root: Path, runs=(("windows", 128, WINDOWS_128), ("streams", 128, STREAMS_128),
                                         ("windows", 512, WINDOWS_512))) -> Path:
    sweep = root / "recall"
    for num, (mode, seq_len, figures, *extra) in enumerate(runs):
        values = summary("astra_alpha", "char", 86_913, 2.31, 3.78, 3.58) | {
            "training_mode": mode, "seq_len": seq_len, "mode_evaluation": {"seq_len": seq_len, "window": 64},
            "probe": "recall", "recall": recall_record(figures, seq_len), **(extra[0] if extra else {})}
        make_job(sweep, num, "astra_alpha", summary=values)
    return sweep


def test_the_memory_horizon_and_the_cost_to_the_language_model(tmp_path):
    sweep = make_recall_sweep(tmp_path)
    plain = summary("astra_alpha", "char", 86_913, 2.25, 3.76, 3.58) | {
        "training_mode": "windows", "seq_len": 128, "mode_evaluation": {"seq_len": 128, "window": 64}, "probe": None,
        "stateful_bpc_se": 0.003, "state_gain_bpc": 0.0001, "state_gain_se": 0.0002}
    make_job(sweep, 3, "astra_alpha", summary=plain)  # the windows (128) run's twin without the probe
    text = build_report(sweep).files["report.md"].read_text()
    horizon = section(text, "Memory horizon")
    # streams (128): under 1 bit up to 96, 2 bits crossed between 192 (1.2) and 384 (2.0): at 384, 3.0x 128
    # windowed: under 1 bit up to 48 (0.45), then 3.0 at 96: 2 bits at 2 ** (log2 48 + 1.55 / 2.55) = 73
    assert "| astra_alpha, streams (128) | 128 | 96 | 384 | 3.0× | 48 | 73 |" in horizon
    # windows (512): 1.5 at 384, 3.0 at 768: 2 bits a third of the way, 2 ** (log2 384 + 1 / 3) = 484
    assert "| astra_alpha, windows (512) | 512 | 192 | 484 | 0.9× | 48 | 73 |" in horizon
    cost = section(text, "What the recall costs the language model")
    assert (f"| astra_alpha, windows (128) | 2.3100 | 2.2500 ± 0.0030 | +0.0600 ± {0.003:.4f} | — | "
            "0.0001 ± 0.0002 | — | — |") in cost
    assert "| astra_alpha, streams (128) | 2.3100 | — | — | — | — | — | — |" in cost  # no twin in the sweep
    assert "| astra_alpha (window 128, no probe) | windows |" in section(text, "Results")


def test_the_recall_table_and_figure(tmp_path):
    report = build_report(make_recall_sweep(tmp_path))
    assert_valid_png(report.files[PLOT_RECALL])
    table = section(report.files["report.md"].read_text(), "Planted recall")
    assert "| distance | training | training window | stateful | windowed | stateless | targets | log2 K |" in table
    assert ("| 16 | windows (128) | inside | 0.200 ± 0.050 | 0.200 ± 0.050 | 3.050 ± 0.040 | 400 | 3.000 |"
            in table)
    assert "| 192 | streams (128) | past | 1.200 ± 0.100 | 3.000 ± 0.050 | 3.050 ± 0.040 | 400 | 3.000 |" in table
    assert "| 192 | windows (512) | inside | 0.800 ± 0.100 |" in table
    rows = [line.split(" | ")[:2] for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert rows[:3] == [["| 16", "windows (128)"], ["| 16", "streams (128)"], ["| 16", "windows (512)"]]
    assert len(rows) == 3 * len(DISTANCES)
    assert ("- astra_alpha, trained on windows (512): 8 keys, 400 plantings, windowed inference on the last 64 "
            "tokens; no memory: log2 K = 3.000 bits. keys of 8 symbols, planted by the test") in table
    assert f"]({PLOT_RECALL})" in table


def test_the_recall_findings_state_their_figures_and_rules(tmp_path):
    text = build_report(make_recall_sweep(tmp_path)).files["report.md"].read_text()
    instrument, carried, kept = numbered_lines(text, "Findings on the planted-recall control")
    assert instrument == finding_line(text, list(RECALL.rules)[0]) and ": supported." in instrument
    assert ("astra_alpha trained on windows (128) (log2 K = 3.000): stateful below log2 K by more than two "
            "standard errors at d = 16: 0.200 ± 0.050, "
            "d = 48: 0.400 ± 0.060, d = 96: 0.900 ± 0.100; windowed past its window (64 tokens) at d = 96: "
            "3.000 ± 0.050") in instrument
    assert "at chance" in instrument and "Detected in 3 of 3 runs" in instrument
    assert carried == finding_line(text, list(RECALL.rules)[1]) and ": partly supported." in carried
    se = math.hypot(0.1, 0.05)
    assert f"d = 192: streams 1.200 ± 0.100, windows 3.000 ± 0.050 (change -1.800 ± {se:.3f})" in carried
    assert "Streams better at 2 of 3 distances, worse at 0" in carried
    assert "(trained on windows (512): d = 192: 0.800 ± 0.100" in carried
    assert kept == finding_line(text, list(RECALL.rules)[2]) and ": partly supported." in kept
    assert ("astra_alpha trained on streams (128): stateful below windowed by more than two standard errors of the "
            "difference at 2 of 3 distances past the window (d = 192: stateful 1.200 ± 0.100, windowed 3.000 ± 0.050); "
            "stateful under 1 bit up to d = 96, crossing 2 bits at d ≈ 384 (3.0× the window)") in kept
    assert "astra_alpha trained on windows (512): stateful below windowed by more than two standard errors of the " \
           "difference at 0 of 1 distances past the window" in kept and "Kept in 1 of 3 runs" in kept
    # the streams finding on real text is still judged by its own rule (here: no state gains, so it cannot be)
    sixth = numbered_lines(text, "Findings")[5]
    assert "cannot be judged" in sixth


def _with(figures: dict, mode: str, index: int, point: tuple) -> dict:
    changed = {key: list(values) for key, values in figures.items()}
    changed[mode][index] = point
    return changed


@pytest.mark.parametrize("runs, verdicts", [
    # the windowed mode below chance past its window: the instrument sees a key it should not
    ((("windows", 128, _with(WINDOWS_128, "windowed", 3, (2.0, 0.1))),),
     ("partly supported", "cannot be judged", "not shown by this sweep")),
    # nothing learned: stateful at chance everywhere
    ((("windows", 128, {"stateful": [(3.0, 0.05)] * 6, "windowed": WINDOWS_128["windowed"]}),
      ("streams", 128, {"stateful": [(3.0, 0.05)] * 6, "windowed": WINDOWS_128["windowed"]})),
     ("not shown by this sweep", "not shown by this sweep", "not shown by this sweep")),
    # streams better by two standard errors at every distance past its window
    ((("windows", 128, WINDOWS_128), ("streams", 128, _with(STREAMS_128, "stateful", 5, (2.5, 0.05)))),
     ("supported", "supported", "partly supported")),
    # streams worse at every one
    ((("windows", 128, {"stateful": WINDOWS_128["stateful"][:3] + [(2.0, 0.05)] * 3,
                        "windowed": WINDOWS_128["windowed"]}),
      ("streams", 128, {"stateful": WINDOWS_128["stateful"][:3] + [(3.0, 0.05)] * 3,
                        "windowed": WINDOWS_128["windowed"]})), ("supported", "contradicted", "partly supported")),
    # a windows run of another window is no pair for streams
    ((("windows", 512, WINDOWS_512), ("streams", 128, STREAMS_128)),
     ("supported", "cannot be judged", "partly supported")),
    # only the transformer, a model of its last tokens: the new finding has no recurrent run to judge
    ((("windows", 128, WINDOWS_128, {"context": 128, "recurrent": False, "family": "transformer"}),),
     ("supported", "cannot be judged", "cannot be judged")),
])
def test_the_recall_findings_follow_the_numbers(tmp_path, runs, verdicts):
    jobs, _ = collect(make_recall_sweep(tmp_path, runs))
    assert tuple(f.verdict for f in RECALL.judge(jobs)) == verdicts


# --- the context curve by class ---------------------------------------------------------------------------
CLASSES = {"word_start": (900, 3.1, -0.012), "word_inside": (2600, 1.6, -0.004), "line_start": (150, 2.2, -0.030),
           "other": (1350, 2.0, -0.002), "long_copy": (310, 1.2, -0.090)}


def by_class() -> dict:
    return {name: {"targets": targets,
                   "curve": {"1": start + 2.0, "2": start + 1.0, "128": start + 0.1, "256": start + 0.05,
                             "stateful": start},
                   "se": {"1": 0.02, "2": 0.02, "128": 0.01, "256": 0.01, "stateful": 0.0},
                   "state_gain": {"bpc": gain, "se": 0.003, "targets": targets}}
            for name, (targets, start, gain) in CLASSES.items()}


def test_the_context_curve_by_class(tmp_path):
    sweep = tmp_path / "classes"
    values = summary("astra_alpha", "char", 86_913, 2.31, 3.78, 3.58)
    values["context_curve"]["by_class"] = by_class()
    make_job(sweep, 0, "astra_alpha", summary=values)
    report = build_report(sweep)
    assert_valid_png(report.files[PLOT_CLASSES])
    table = section(report.files["report.md"].read_text(), "Context curve by class of target")
    assert "| class | targets | 1 | 2 | 128 | 256 | stateful | state gain |" in table
    assert ("| word_start | 900 | 5.100 ± 0.020 | 4.100 ± 0.020 | 3.200 ± 0.010 | 3.150 ± 0.010 | 3.100 | "
            "-0.0120 ± 0.0030 |") in table
    assert [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ") and "±" in line] == [
        f"| {name}" for name in CLASSES]
    row = read_rows(sweep / "results.csv")["0_astra_alpha"]
    assert float(row["long_copy_state_gain_bpc"]) == -0.090 and float(row["long_copy_state_gain_se"]) == 0.003


# --- older summaries ----------------------------------------------------------------------------------------
def test_a_sweep_without_the_new_records_still_reports(tmp_path):
    report = build_report(make_sweep(tmp_path))
    text = report.files["report.md"].read_text()
    for title in ("Generated text", "Planted recall", "Context curve by class of target"):
        assert f"## {title}\n" not in text
    assert not {PLOT_TEXT, PLOT_RECALL, PLOT_CLASSES} & set(report.files)
    controls = numbered_lines(text, "Findings on the planted-recall control")
    words = numbered_lines(text, "Findings on the generated text")
    assert [line.split(".", 1)[0] for line in controls + words] == [str(n) for n in range(8, 16)]
    assert all("**: cannot be judged. Missing: " in line for line in controls + words)
    assert len(numbered_lines(text, "Findings")) == 7
    row = next(iter(read_rows(report.files["results.csv"]).values()))
    assert row["text_stateful_word_validity"] == "" and row["long_copy_state_gain_bpc"] == ""


# --- three runs of one model: windows (128), streams (128), windows (512) ----------------------------------
def test_runs_of_one_model_at_two_windows_are_told_apart(tmp_path):
    """The grid and the streams finding pair the streams run with the windows run of its own window; every section
    per run heads a run by its training where the model's name alone is ambiguous."""
    sweep = tmp_path / "three"
    for num, (mode, seq_len, gain) in enumerate((("windows", 128, (0.002, 0.001)), ("streams", 128, (-0.05, 0.004)),
                                                 ("windows", 512, (-0.20, 0.004)))):
        values = summary("astra_alpha", "char", 86_913, 2.30 + gain[0], 3.78, 3.58) | {
            "training_mode": mode, "windowed_bpc": 2.30, "state_gain_bpc": gain[0], "state_gain_se": gain[1],
            "seq_len": seq_len, "mode_evaluation": {"seq_len": seq_len, "window": 128}}
        values["context_curve"]["by_class"] = by_class()
        make_job(sweep, num, "astra_alpha", summary=values)
    text = build_report(sweep).files["report.md"].read_text()
    grid = section(text, "Training mode against inference mode")
    assert [line.split(" | ")[1] for line in grid.splitlines() if line.startswith("| astra_alpha |")] == [
        "windows (128)", "windows (512)", "streams (128)"]
    sixth = numbered_lines(text, "Findings")[5]
    assert "+0.00200 ± 0.00100 trained on windows, -0.05000 ± 0.00400 trained on streams" in sixth
    assert "-0.20000" not in sixth and "**: supported." in sixth
    headings = [line for line in section(text, "Context curve by class of target").splitlines()
                if line.startswith("### ")]
    assert headings == ["### astra_alpha (window 128)", "### astra_alpha (streams)", "### astra_alpha (window 512)"]
