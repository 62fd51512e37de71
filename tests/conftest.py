"""Shared fixtures: configs composed with Hydra's compose API into tmp_path, and corpora.

Tests never use the network: the real corpus is the copy shipped in the package
(gru_experiments/data/corpora), small corpora are made here.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
os.environ.setdefault("PROJECT_ROOT", str(REPO))
os.environ.setdefault("WANDB_SILENT", "true")
# Test shapes are tiny, so per-op overhead dominates: one thread per process is faster, and keeps
# subprocess tests from oversubscribing a small machine. (Set before torch is imported.)
os.environ.setdefault("OMP_NUM_THREADS", "1")

MODELS = ["astra_alpha", "astra_beta", "astra_gamma", "scribe_alpha", "scribe_beta", "scribe_gamma", "leviathan"]


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory) -> Path:
    """The shipped Tiny Shakespeare as a plain text file (read and sha256-checked by corpus.read_corpus)."""
    from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus

    path = tmp_path_factory.mktemp("corpus") / "tinyshakespeare.txt"
    path.write_text(read_corpus(SHIPPED_CORPUS), encoding="utf-8")
    return path


def make_text(n_chars: int = 20_000, seed: int = 0) -> str:
    """A small play-like corpus that is not Tiny Shakespeare (its own alphabet and layout)."""
    rng = random.Random(seed)
    words = ["arbre", "étoile", "lumière", "río", "mañana", "noche", "gato", "perro", "ciel", "mer",
             "vent", "soleil", "lune", "fleur", "jardin", "camino", "verde", "azul", "œuvre", "ça"]
    lines = []
    while sum(map(len, lines)) < n_chars:
        speaker = rng.choice(["ÉLISE", "JUAN", "MARÍA"])
        body = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        lines.append(f"{speaker}:\n{body.capitalize()}{rng.choice('.!?,;')}\n"
                     f"  {rng.choice(words)}   {rng.choice(words)}\n\n")
    return "".join(lines)[:n_chars]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(make_text(), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One tokenizer/data cache for the whole session, so spm is trained once per corpus."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def compose_config(tmp_path, data_dir):
    """compose_config("model=astra_beta", ...) -> the train config, writing into tmp_path."""

    def _compose(*overrides: str, config_name: str = "train"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name=config_name, overrides=[
                f"paths.output_dir={tmp_path / 'run'}", f"paths.data_dir={data_dir}",
                f"paths.log_dir={tmp_path / 'outputs'}", "logger=none", *overrides])

    return _compose


@pytest.fixture(scope="session")
def small_shakespeare(tmp_path_factory, shakespeare) -> Path:
    """60k characters of Richard III: quick to train on, and its training split spells the study's
    prompts ("ROMEO: ", "KING: ", "FIRST CITIZEN: ")."""
    path = tmp_path_factory.mktemp("corpus") / "richard.txt"
    path.write_text(shakespeare.read_text(encoding="utf-8")[170_000:230_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_corpus) -> Path:
    """A workspace with a finished run and a tokenizer cache, which bad commands must not touch (each test module
    that asks for it gets its own): its outputs/ and data/ as train.py would use them under PROJECT_ROOT."""
    from robustness_helpers import compose_in, train

    from gru_experiments.data.corpus import prepare_corpus

    root = tmp_path_factory.mktemp("workspace")
    cfg = compose_in(root, f"data.path={tiny_corpus}", "trainer.max_steps=2", "model.steps_per_epoch=2",
                     output_dir=root / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000")
    train(cfg)
    spm = compose_in(root, f"data.path={tiny_corpus}", "tokenizer=spm", "tokenizer.vocab_size=60")
    prepare_corpus(spm.data, spm.tokenizer, root / "data" / "tokenizers")
    return root


def finding_line(report_md: str, claim: str) -> str:
    """report.md's line of the finding of that claim, under the number the report gives it (report.finding_number):
    a test finds a finding by its claim, so one added before it moves its number and breaks no test."""
    from gru_experiments.report.report import finding_number

    start = f"{finding_number(claim)}. **{claim}**: "
    return next(line for line in report_md.splitlines() if line.startswith(start))


def strict_json(text: str):
    """JSON as RFC 8259 has it: NaN, Infinity and -Infinity are refused (Python's json takes them)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def json_with_non_finite_numbers(folder: Path) -> list[str]:
    """Every .json file under `folder` that holds NaN or Infinity (a file that is not JSON at all, which some
    tests write on purpose, is left alone)."""
    found = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            text = path.read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, ValueError):
            continue
        try:
            strict_json(text)
        except ValueError as error:
            found.append(f"{path}: {error}")
    return found


@pytest.fixture(scope="session", autouse=True)
def every_json_file_is_strict(tmp_path_factory):
    """No JSON file that the session's runs, sweeps and sampling runs wrote (all under its temporary folders)
    holds NaN or Infinity (issue 36)."""
    yield
    found = json_with_non_finite_numbers(tmp_path_factory.getbasetemp())
    assert not found, "JSON files with NaN or Infinity: " + "; ".join(found[:5])
