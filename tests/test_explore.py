"""The run's page (sample.py explore=true; docs/explore.md): its figures are the evaluation's, every unit
ranking puts a planted unit first, the probe's key is found in the unit that holds it, the page renders
in a real headless browser, and the sweep report links it."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from gru_experiments.data.recall_probe import Pairs, ProbeSymbols, SymbolIds, plant, planting_generator
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.study.explore import (
    PlantedText,
    correlation_ranking,
    explore,
    key_ranking,
    key_spread,
    let_go,
    text_features,
    unit_pass,
)
from gru_experiments.study.explore_page import render_page
from gru_experiments.study.scores import Split, score_stateful, score_stateless, score_windowed

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
TEXT = ('KING: Now is the winter (of our) discontent\nmade "glorious summer" by this sun\n'
        "of York; and o'er the clouds [that lour'd] upon our house\n") * 6
SYMBOLS = ProbeSymbols("\u27ea", "\u27eb", ("A", "B", "C", "D"))  # keys: letters TEXT does not use


def page_data(html: str) -> dict:
    """The data a page carries (its inline JSON)."""
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


# --- the figures are the evaluation's -------------------------------------------------------------------

def small_models(vocab: int, ids: torch.Tensor) -> dict:
    torch.manual_seed(0)
    return {"gru": RecurrentLM(vocab, "gru", 8, 16, num_layers=2), "lstm": RecurrentLM(vocab, "lstm", 8, 12),
            "transformer": TransformerLM(vocab, block_size=16, embedding_dim=16, num_layers=1, num_heads=2),
            "mlp": BengioMLP(vocab, context=4, embedding_dim=4, hidden_size=16),
            "ngram": NGramLM(vocab, order=3).fit(ids)}


@pytest.mark.parametrize("family", ["gru", "lstm", "transformer", "mlp", "ngram"])
def test_bits_per_character_are_the_evaluations(family):
    tokenizer = CharTokenizer.from_text(TEXT)
    ids = torch.tensor(tokenizer.encode(TEXT))
    model = small_models(tokenizer.vocab_size, ids)[family].eval()
    data = explore(model, tokenizer, ids, seq_len=32, window=16)
    split = Split.of(ids, tokenizer)
    expected = {"stateful": score_stateful(model, split, 32, streams=1).bpc,
                "windowed": score_windowed(model, split, 16).bpc, "stateless": score_stateless(model, split).bpc}
    assert data["bpc"] == expected  # exactly: the same functions on the same text
    for mode, bpc in expected.items():  # and every token's bits add up to them (rounded to 1e-3 bit each)
        bits = data["bits"][mode]
        assert bits[0] is None and abs(sum(bits[1:]) / (len(ids) - 1) - bpc) < 1e-3
    # The top predictions come from their own pass: the stateful one agrees with the scored bits.
    logits, units = unit_pass(model, ids[None], 32)
    own = -logits[0, :-1].log_softmax(-1).gather(1, ids[1:, None]).squeeze(1) / math.log(2)
    assert torch.allclose(own.double(), torch.tensor(data["bits"]["stateful"][1:], dtype=torch.float64), atol=2e-3)
    assert (units is not None) == (family in ("gru", "lstm")) == bool(data["rankings"])


# --- every ranking puts a planted unit first -----------------------------------------------------------

def test_text_features_by_hand():
    features = text_features(list('ab "c"\n(d e) o\'er'))
    assert features["quote"].tolist() == [0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert features["line_position"].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert features["in_word"].tolist() == [1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("feature", ["quote", "line_position", "in_word"])
def test_each_ranking_puts_the_unit_that_follows_its_feature_first(feature):
    features = text_features(list(TEXT))
    torch.manual_seed(1)
    others = [features[name] for name in features if name != feature]
    # Decoys: noise, the other features with noise; the planted unit (column 7) is the feature, rescaled.
    units = torch.randn(len(TEXT), 12)
    units[:, :len(others)] += torch.stack(others, 1) * 2
    units[:, 7] = 0.5 - 3 * features[feature]
    ranking = correlation_ranking(units, features[feature])
    assert int(ranking.argmax()) == 7 and ranking[7] == pytest.approx(1.0)
    assert correlation_ranking(units, torch.ones(len(TEXT))).eq(0).all()  # a constant feature ranks nothing


def latching_gru(tokenizer: CharTokenizer, keys: list[int]) -> RecurrentLM:
    """A one-layer GRU whose unit 2 takes a value per key at a key and holds it (z = 0 elsewhere, nothing
    else feeding it); its other units follow the text and never see a key."""
    torch.manual_seed(2)
    vocab, hidden = tokenizer.vocab_size, 6
    model = RecurrentLM(vocab, "gru", vocab, hidden, dropout=0.0, implementation="reference")
    layer = model.layers[0]
    z, candidate = hidden + 2, 2 * hidden + 2  # unit 2's rows of the update gate and the candidate
    with torch.no_grad():
        model.embedding.weight.copy_(torch.eye(vocab))  # one-hot inputs
        layer.input_weight[:, keys] = 0  # no other unit sees which key
        layer.hidden_weight_rz[:, 2], layer.hidden_weight_candidate[:, 2] = 0, 0  # nor reads unit 2
        layer.input_weight[z], layer.input_bias[z], layer.hidden_weight_rz[z], layer.hidden_bias_rz[z] = 0, -30, 0, 0
        layer.input_weight[candidate], layer.input_bias[candidate], layer.hidden_weight_candidate[2] = 0, 0, 0
        for j, key in enumerate(keys):
            layer.input_weight[z, key] = 60.0  # z = 1 at a key: take the candidate; else 0: hold
            layer.input_weight[candidate, key] = -1.5 + j
    return model.eval()


def planted_text(tokenizer, text: str, seed: int = 0):
    symbols = SymbolIds.of(SYMBOLS, tokenizer)
    ids = torch.tensor(tokenizer.encode(text))
    planting = plant(ids, Pairs((8, 16, 40), 6), symbols, planting_generator(seed, "test", 0))
    hold = torch.cat([torch.tensor([symbols.opening, int(symbols.keys[0])]), ids[:150]])
    return PlantedText(planting, symbols.keys, hold)


def test_the_latched_key_ranking_finds_the_unit_that_holds_the_key():
    tokenizer = CharTokenizer.from_text(TEXT + "".join([SYMBOLS.opening, SYMBOLS.closing, *SYMBOLS.keys]))
    keys = tokenizer.encode("".join(SYMBOLS.keys))
    model, probe = latching_gru(tokenizer, keys), planted_text(tokenizer, TEXT)
    ids = probe.planting.ids
    assert probe.planting.first_key.numel() >= 3
    data = explore(model, tokenizer, ids, seq_len=32, window=16, probe=probe, ranked=6)
    assert data["rankings"]["key"][0][:2] == [0, 2]
    assert data["rankings"]["key"][1][2] == 0  # no other unit sees the key at all
    holder = data["recall"]["holders"][0]
    assert holder[:2] == [0, 2] and holder[3] is None  # it never lets go
    for pair in data["recall"]["pairs"]:
        assert pair["carriers"][0][:2] == [0, 2] and SYMBOLS.keys[pair["key_index"]] == pair["key"]
        assert set(pair["bits"]) == {"stateful", "windowed", "stateless"}
    # The spread, directly: unit 2 apart over the keys from the first key through the closing marker, then
    # the recalled key (the same in every run) overwrites it; the other units never apart.
    first, d = int(probe.planting.first_key[0]), int(probe.planting.distances[0])
    spread = key_spread(model, ids, first, probe.keys, d + 10, 32)
    assert (spread[:d + 2, 2] > 0.1).all() and spread[d + 2:, 2].max() < 1e-6
    assert spread[:, [0, 1, 3, 4, 5]].max() < 1e-6


def test_let_go_is_where_the_spread_stays_under_a_quarter_of_its_peak():
    lags = torch.arange(100.0)
    spread = torch.stack([torch.exp(-lags / 10), torch.ones(100), torch.zeros(100)], 1)
    spread[60, 0] = 0.5  # a late return above a quarter: it let go only after it
    assert let_go(spread) == [61, None, 0]
    ranking = key_ranking([spread], [10], torch.tensor([1.0, 2.0, 0.0]))
    assert ranking.tolist() == pytest.approx([float(torch.exp(-lags[1:11] / 10).mean()), 0.5, 0.0])


# --- the page: self-contained, and right in a real browser ----------------------------------------------

def train_and_explore(root, corpus, *overrides: str):
    """A two-step Astra-alpha run and its page, by the commands a user types: the run folder."""
    run_dir = root / "outputs" / "runs" / "astra_alpha" / "run1"
    common = [f"paths.data_dir={root / 'data'}", f"paths.log_dir={root / 'outputs'}"]
    subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *common, "logger=none",
                    f"data.path={corpus}", "data.batch_size=4", "data.seq_len=32", "trainer.max_steps=2",
                    "model.steps_per_epoch=2", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
                    "evaluation.text.samples=0", "evaluation.samples.chars=20", *overrides], cwd=REPO, check=True,
                   capture_output=True)
    done = subprocess.run([sys.executable, "sample.py", f"run={run_dir}", "explore=true", "explore_chars=600",
                           "explore_start=100", "explore_hold=300", *common], cwd=REPO, check=True,
                          capture_output=True, text=True)
    assert "explore.html" in done.stdout
    return run_dir


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, small_shakespeare):
    return train_and_explore(tmp_path_factory.mktemp("explore"), small_shakespeare), small_shakespeare


@pytest.mark.slow
def test_a_probe_runs_page_plants_the_probes_pairs(tmp_path, small_shakespeare):
    run_dir = train_and_explore(tmp_path, small_shakespeare, "probe=recall", "probe.validation.distances=[8,16]",
                                "probe.validation.min_targets=2")
    data = page_data((run_dir / "explore.html").read_text(encoding="utf-8"))
    pairs, recall = data["recall"]["pairs"], data["recall"]
    # Validation distances up to a quarter of the 600 tokens, the run's own markers and keys.
    assert pairs and {p["distance"] for p in pairs} <= {8, 16} and recall["keys"] == 16
    assert all(data["tokens"][p["first"] - 1] == "\u27ea" and data["tokens"][p["recall"] - 1] == "\u27eb"
               and data["tokens"][p["recall"]] == p["key"] and len(p["carriers"]) == 3 for p in pairs)
    assert recall["hold_length"] == 300 and len(recall["holders"]) == 12 and "key" in data["rankings"]
    assert data["title"]["planted"] and len(data["tokens"]) == 600


@pytest.mark.slow
def test_sample_explore_writes_a_self_contained_page(trained_run):
    run_dir, _ = trained_run
    page = (run_dir / "explore.html").read_text(encoding="utf-8")
    assert "<script src" not in page and "<link" not in page and "http" not in page and "@import" not in page
    assert page.count('id="data"') == 1 and len(page.encode()) < 400_000  # the data once: 600 tokens x 128 units
    data = page_data(page)
    assert len(data["tokens"]) == 600 and data["layers"] == [128] and set(data["rankings"]) == {"line_position",
                                                                                             "in_word"}
    assert data["constant"] == ["quote"]  # Tiny Shakespeare has no quotation marks or brackets


@pytest.mark.slow
def test_a_checkpoint_without_its_run_folder_gets_its_page_in_the_sampling_folder(trained_run, tmp_path):
    run_dir, corpus = trained_run
    loose = tmp_path / "loose.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", loose)
    out = tmp_path / "sampling"
    subprocess.run([sys.executable, "sample.py", f"ckpt={loose}", "explore=true", f"hydra.run.dir={out}",
                    f"data.path={corpus}", "data.seq_len=32", "explore_text=ROMEO:\\nO Romeo",
                    f"paths.data_dir={tmp_path}"],
                   cwd=REPO, check=True, capture_output=True)
    data = page_data((out / "explore.html").read_text(encoding="utf-8"))
    assert "".join(data["tokens"]) == "ROMEO:\nO Romeo" and data["title"]["text"] == "explore_text"


def evaluation_bpc(run_dir, corpus) -> dict:
    """Each mode's bits per character of the run's default slice, by the evaluation's scoring functions."""
    from gru_experiments.data.corpus import read_corpus, split_text
    from gru_experiments.runs.task import load_checkpoint

    task = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    text = split_text(read_corpus(corpus), 0.9)[1][100:700]
    split = Split.of(torch.tensor(task.tokenizer.encode(text)), task.tokenizer)
    return {"stateful": score_stateful(task.model, split, 32, streams=1).bpc,
            "windowed": score_windowed(task.model, split, 32).bpc, "stateless": score_stateless(task.model, split).bpc}


def render(page, fragment: str) -> str:
    """The page's DOM after its script ran, in headless Chromium, opened at `#fragment`."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                           "--dump-dom", f"{page.as_uri()}#{fragment}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def colours(dom: str) -> list[str]:
    return re.findall(r'<span class="t[^"]*" data-i="\d+" style="background: ([^"]*);"', dom)


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no Chromium installed (Debian: apt-get install chromium; .ci/run installs it)")
def test_the_page_renders_in_a_headless_browser(trained_run):
    run_dir, corpus = trained_run
    page = run_dir / "explore.html"
    stateful, stateless = render(page, "mode=stateful"), render(page, "mode=stateless")
    text = "".join(re.findall(r'data-i="\d+"[^>]*>([^<]*)</span>', stateful))
    assert text.replace("\u21b5", "") == "".join(page_data(page.read_text())["tokens"]).replace("&", "&amp;")
    assert len(colours(stateful)) == len(colours(stateless)) == 599  # every token predicted is shaded
    assert colours(stateful) != colours(stateless)  # switching the mode changes the colours
    difference = colours(render(page, "mode=stateless&minus=stateful"))
    assert difference != colours(stateless) and any(c.endswith("255)") and not c.startswith("rgb(255")
                                                     for c in difference)  # blue: cheaper than stateful
    shown = dict(re.findall(r'<b id="bpc-(\w+)">([\d.]+)</b>', stateful))
    assert shown == {mode: f"{bpc:.4f}" for mode, bpc in evaluation_bpc(run_dir, corpus).items()}
    units = colours(render(page, "view=units&layer=0&unit=5"))
    assert len(units) == 600 and units != colours(stateful)


def test_a_page_without_units_says_so_and_still_shows_the_recall():
    tokenizer = CharTokenizer.from_text(TEXT + "".join([SYMBOLS.opening, SYMBOLS.closing, *SYMBOLS.keys]))
    probe = planted_text(tokenizer, TEXT)
    ids = probe.planting.ids
    data = explore(NGramLM(tokenizer.vocab_size, order=2).fit(ids), tokenizer, ids, seq_len=32, window=8, probe=probe)
    data["title"] = {"model": "ngram2", "checkpoint": "x", "text": "TEXT", "planted": True}
    page = render_page(data)
    assert page_data(page)["units"] == [] and "surprisal view only" in page and not data["rankings"]
    pair = data["recall"]["pairs"][0]
    assert pair["carriers"] == [] and pair["bits"]["stateful"] == data["bits"]["stateful"][pair["recall"]]
    assert data["recall"]["chance_bits"] == 2.0 and "holders" not in data["recall"]


def test_the_sweep_report_links_each_page(tmp_path):
    from gru_experiments.report.report import explore_section
    from gru_experiments.report.sweep_folder import JobResult

    jobs = [JobResult("0_astra_alpha", "completed", {"model": "astra_alpha"}, tmp_path / "0_astra_alpha"),
            JobResult("1_astra_beta", "completed", {"model": "astra_beta"}, tmp_path / "1_astra_beta")]
    assert explore_section(jobs) == []
    (tmp_path / "0_astra_alpha").mkdir()
    (tmp_path / "0_astra_alpha" / "explore.html").write_text("<html></html>")
    assert "- [astra_alpha](0_astra_alpha/explore.html)" in explore_section(jobs)
    assert not any("astra_beta" in line for line in explore_section(jobs))
