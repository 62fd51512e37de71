"""report.md's *The cache* and its two findings, judged per corpus, over synthetic summaries."""

from __future__ import annotations

import pytest
from test_report import make_job

from gru_experiments.data.corpus import corpus_name
from gru_experiments.report.cache import CACHE, long_range_finding, unread_finding
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import JobResult, read_job

UNREAD, LONG_RANGE = list(CACHE.rules)


PYSTDLIB_SHA256 = "0580ce98cfae237574409a8795e9ef8178eecde50b7c1c985f0ae59bb2121230"  # conf/data/pystdlib.yaml


def job(model, corpus, past, past_se, gain, gain_se, **more):
    values = {"model": model, "family": "gru", "corpus": corpus, "cache_past_window_bpc": past,
              "cache_past_window_se": past_se, "state_gain_bpc": gain, "state_gain_se": gain_se, **more}
    return JobResult(f"0_{model}", "completed", values)


def test_the_run_s_corpus_is_named_from_its_data_config():
    assert corpus_name(None, None, None) == "tinyshakespeare"
    assert corpus_name(None, None, PYSTDLIB_SHA256) == "pystdlib"  # a shipped file, found by its hash
    assert corpus_name("/x/my_text.txt.xz", None, None) == "my_text"
    # a download of another text: the file's name in its URL, without the query
    assert corpus_name(None, "https://example.org/texts/sonnets.txt?raw=1", "ab" * 32) == "sonnets.txt"


def test_a_job_s_corpus_is_its_name_not_its_summary_s_path(tmp_path):
    summary = {"status": "completed", "corpus": "/site-packages/gru_experiments/data/corpora/tinyshakespeare.txt.xz"}
    assert read_job(make_job(tmp_path, 0, "astra_alpha", summary=summary)).values["corpus"] == "tinyshakespeare"


def test_the_findings_follow_the_numbers_per_corpus():
    # Tiny Shakespeare: the cache finds bits past the window that the state (0) does not read; code: the state
    # reads them (its gain is the cache's).
    shakespeare = [job("astra_alpha", "tinyshakespeare", -0.02, 0.002, 0.0, 0.0001),
                   job("astra_beta", "tinyshakespeare", -0.015, 0.002, 0.0002, 0.0002)]
    code = [job("astra_alpha", "pystdlib", -0.05, 0.003, -0.048, 0.003)]
    verdict, evidence = unread_finding(shakespeare + code)
    assert verdict == "partly supported" and "Supported for 2 of 3 models" in evidence
    assert "on tinyshakespeare, astra_alpha: cache past the window -0.0200 ± 0.0020" in evidence
    assert "on pystdlib" in evidence
    verdict, evidence = long_range_finding(shakespeare + code)
    assert verdict == "partly supported" and "for 1 of 3 models" in evidence
    verdict, _ = long_range_finding(code)
    assert verdict == "supported"
    # Where the cache finds nothing past the window: no information to read, and no corpus to judge the second on.
    flat = [job("astra_alpha", "tinyshakespeare", -0.0001, 0.001, 0.0, 0.0001)]
    assert unread_finding(flat)[0] == "contradicted"
    verdict, evidence = long_range_finding(flat)
    assert verdict == "cannot be judged" and "none of tinyshakespeare" in evidence
    # The state never buys bits where the cache does: contradicted.
    assert long_range_finding(shakespeare)[0] == "contradicted"


def test_the_findings_say_what_is_missing():
    bare = [JobResult("0_a", "completed", {"model": "a", "family": "gru"})]
    assert unread_finding(bare)[0] == long_range_finding(bare)[0] == "cannot be judged"
    # A corpus with structure past the window, but no stateful - windowed of any model on it: the second finding
    # names the figure it lacks.
    cache_alone = [job("astra_alpha", "pystdlib", -0.05, 0.003, None, None)]
    verdict, evidence = long_range_finding(cache_alone)
    assert verdict == "cannot be judged" and "stateful - windowed on pystdlib" in evidence


@pytest.mark.parametrize("kind", ["continuous", "count"])
def test_the_section_s_table_and_findings_in_report_md(tmp_path, kind):
    sweep = tmp_path / "sweep"
    by_size = {str(n): {"lambda": 0.1, "parameter": 0.5, "bpc": 2.0, "gain_bpc": -0.01 * (i + 1), "gain_se": 0.001,
                        "past_window_bpc": None if n == 128 else -0.005 * i, "past_window_se": 0.001}
               for i, n in enumerate((128, 256, 512))}
    summary = {"status": "completed", "model": "astra_alpha", "family": "gru", "stateful_bpc": 2.0,
               "state_gain_bpc": 0.0, "state_gain_se": 0.0001, "cache_size": 512, "cache_gain_bpc": -0.02,
               "cache_gain_se": 0.001, "cache_past_window_bpc": -0.01, "cache_past_window_se": 0.001,
               "cache": {"kind": kind, "window": 128, "sizes": [128, 256, 512], "longest": 512, "model_bpc": 2.01,
                         "by_size": by_size}}
    make_job(sweep, 0, "astra_alpha", summary=summary)
    build_report(sweep)
    report = (sweep / "report.md").read_text()
    assert "## The cache" in report and "| N = 128 | N = 256 | N = 512 |" in report
    assert f"| astra_alpha | tinyshakespeare | {kind} | 2.0100 | -0.0100 ± 0.0010 | -0.0200 ± 0.0010 |" in report
    assert f"**{UNREAD}**: supported." in report and f"**{LONG_RANGE}**: contradicted." in report
    assert "cache_past_window_bpc" in (sweep / "results.csv").read_text().splitlines()[0]
