"""Any UTF-8 text trains with the char tokenizer: a corpus whose validation split (its last tenth)
has characters the training split lacks trains end to end through train.py, and every figure of
its summary is finite (the char vocabulary is the whole corpus's characters)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from robustness_helpers import run_script

NEW_CHARACTERS = "é½\tcf"  # "café" brings c and f too


def corpus_with_new_characters_at_the_end(n_chars: int = 12_000) -> str:
    """ASCII lines for the first 90%; the last 10% also uses 'é', '½', a tab, 'c' and 'f'."""
    rng = random.Random(0)
    words = ["the", "king", "shall", "speak", "now", "and", "then", "go", "home", "night"]

    def lines(extra: list[str], n: int) -> str:
        out = []
        while sum(map(len, out)) < n:
            out.append(" ".join(rng.choice(words + extra) for _ in range(rng.randint(3, 9))) + ".\n")
        return "".join(out)[:n]

    head = lines([], int(n_chars * 0.9) + 1)
    tail = lines(["café", "½", "\tthe"], n_chars - len(head))
    return head + tail


@pytest.fixture(scope="module")
def new_chars_corpus(tmp_path_factory) -> Path:
    text = corpus_with_new_characters_at_the_end()
    cut = int(len(text) * 0.9)
    assert set(text[cut:]) - set(text[:cut]) == set(NEW_CHARACTERS)  # the premise of every test here
    path = tmp_path_factory.mktemp("corpus") / "new_chars.txt"
    path.write_text(text, encoding="utf-8")
    return path


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.parametrize("model", ["astra_alpha", "ngram3"])
@pytest.mark.slow
def test_a_corpus_whose_validation_split_has_new_characters_trains_end_to_end(tmp_path, new_chars_corpus, model):
    result = run_script(tmp_path, f"model={model}", f"data.path={new_chars_corpus}", "data.train_fraction=0.9",
                        "preset=smoke", "logger=none", "trainer.accelerator=cpu", "evaluation.samples.chars=20")
    assert result.returncode == 0, result.stderr[-3000:]
    [summary_file] = (tmp_path / "outputs").rglob("summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary.get("status") != "failed", summary
    text = new_chars_corpus.read_text(encoding="utf-8")
    assert summary["vocab_size"] == len(set(text))  # the whole corpus's characters, the new ones included
    for mode in ("stateful", "stateless", "windowed", "bigram"):
        for unit in ("nll", "bpc"):
            assert finite(summary[f"{mode}_{unit}"]) and summary[f"{mode}_{unit}"] > 0, (mode, unit, summary)
    assert finite(summary["val_bpc"])
    curve = {k: v for k, v in summary["context_curve"].items() if k not in ("settings", "by_class")}
    assert curve and all(finite(v) for v in curve.values()), curve
