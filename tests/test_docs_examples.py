"""The docs' how-to examples run as written (issue 71): each fenced example of docs/evaluation.md's *How to add a
figure*, docs/outputs.md's *How to add a report section* and *How to add a finding*, and docs/configuration.md's
*Adding a model*, read from the page and written as the module (or config file) it describes; what it registers
reaches the evaluation's summary, results.csv or report.md, and is taken out after. Their names are their own: no
other test uses them."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, finding_line, make_text
from evaluation_helpers import defaults
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_findings import MODELS, summary
from test_report import make_job

from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.protocol import build_model
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.report.report import SECTIONS, build_report
from gru_experiments.runs.checks import validate
from gru_experiments.runs.trained_run import TrainedRun, evaluate
from gru_experiments.study.evaluation import ENTRIES, EvaluationSettings
from gru_experiments.study.scores import Split

DOCS = REPO / "docs"


def examples(page: str, heading: str, language: str = "python") -> list[str]:
    """The fenced `language` blocks under `heading` in docs/`page`, up to the next heading of its level or above."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip() == heading)
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    blocks, block = [], None
    for line in lines[start + 1:]:
        if block is None and re.match(rf"#{{1,{level}}} ", line):
            break
        if block is None and line.strip() == f"```{language}":
            block = []
        elif block is not None and line.strip() == "```":
            blocks.append("\n".join(block) + "\n")
            block = None
        elif block is not None:
            block.append(line)
    return blocks


class Examples:
    """The docs' examples run as a reader's own modules under `folder`, and what they registered."""

    def __init__(self, folder: Path):
        self.folder, self.modules = folder, []
        self.entries, self.sections = list(ENTRIES), list(SECTIONS)

    def run(self, code: str, name: str) -> None:
        """`code` written as the module `name`.py, linted as the project's code, and imported."""
        path = self.folder / f"{name}.py"
        path.write_text(code, encoding="utf-8")
        lint = subprocess.run([str(Path(sys.executable).with_name("ruff")), "check", "--no-cache", "--config",
                               str(REPO / "pyproject.toml"), str(path)], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # where a dataclass looks its module up
        self.modules.append(name)
        spec.loader.exec_module(module)

    def names(self) -> set[str]:
        """What they registered names: entries, sections, columns, findings' headings and claims."""
        entries = [entry for entry in ENTRIES if entry not in self.entries]
        sections = [section for section in SECTIONS if section not in self.sections]
        findings = [section.findings for section in sections if section.findings]
        return ({entry.name for entry in entries} | {section.name for section in sections}
                | {column for section in sections for column in section.columns}
                | {group.heading for group in findings} | {claim for group in findings for claim in group.rules})

    def take_out(self) -> None:
        ENTRIES[:], SECTIONS[:] = self.entries, self.sections
        for name in self.modules:
            sys.modules.pop(name, None)


@pytest.fixture
def docs_examples(tmp_path):
    """The examples a test runs, their registrations taken out after it whatever it does."""
    found = Examples(tmp_path)
    try:
        yield found
    finally:
        found.take_out()


def assert_no_other_test_uses(names) -> None:
    """No test file but this one has any of `names` as a string: the docs' examples use names of their own."""
    used = {(path.name, name) for path in (REPO / "tests").glob("*.py") if path.name != Path(__file__).name
            for name in names if f'"{name}"' in (text := path.read_text(encoding="utf-8")) or f"'{name}'" in text}
    assert not used, used


def test_the_figure_examples_reach_the_evaluation_s_summary(docs_examples):
    doubles, top_one = examples("evaluation.md", "How to add a figure")
    docs_examples.run(doubles, "doubles_example")
    docs_examples.run(top_one, "top_one_example")
    text = make_text(3_000)
    tokenizer = CharTokenizer.from_text(text)
    ids = torch.tensor(tokenizer.encode(text))
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=8, hidden_size=16, num_layers=1).eval()
    settings = EvaluationSettings.of(defaults() | {"streams": 1, "curve_longest": None,
                                                   "text": defaults()["text"] | {"samples": 0}}, 16)
    figures = evaluate(TrainedRun(model, tokenizer, "example"), settings, Split.of(ids, tokenizer),
                       training_tokens=None).summary()
    assert figures["doubled_targets"] == int((ids[1:] == ids[:-1]).sum()) > 0
    hits, state = 0, None  # the stateful pass: one stream in chunks of 16, the state carried
    with torch.no_grad():
        for start in range(0, ids.numel() - 1, 16):
            chunk = ids[start:min(start + 16, ids.numel() - 1)]
            logits, state = model(chunk[None], state)
            hits += int((logits[0].argmax(-1) == ids[start + 1:start + 1 + chunk.numel()]).sum())
    assert figures["top1_accuracy"] == pytest.approx(hits / (ids.numel() - 1), abs=1e-12)
    assert_no_other_test_uses(docs_examples.names() | {"doubled_targets", "top1_accuracy"})


def test_the_section_and_finding_examples_reach_the_report(tmp_path, docs_examples):
    [section] = examples("outputs.md", "How to add a report section")
    [finding] = examples("outputs.md", "How to add a finding")
    docs_examples.run(section, "speed_example")
    docs_examples.run(finding, "size_example")
    sweep = tmp_path / "sweep"
    for num, (model, tokenizer, parameters, *bpc) in enumerate(MODELS):
        make_job(sweep, num, model, tokenizer=tokenizer, summary=summary(model, tokenizer, parameters, *bpc) | {
            "tokens_per_second": 1000.0 * (num + 1)})
    built = build_report(sweep)
    text = built.files["report.md"].read_text()
    assert "## Speed\n\n- astra_alpha: 1,000 tokens/s\n- astra_beta: 2,000 tokens/s\n" in text
    assert "speed" in built.files["results.csv"].read_text().splitlines()[0].split(",")
    line = finding_line(text, "The largest model of a tokenizer beats its smallest, stateful")
    assert ": supported. Stateful bits per character, largest - smallest: char: astra_beta - astra_alpha " in line
    assert_no_other_test_uses(docs_examples.names())


def test_the_model_example_composes_and_builds(tmp_path):
    [config] = examples("configuration.md", "Adding a model", "yaml")
    path = re.match(r"# (conf/model/(\w+)\.yaml):", config)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (tmp_path / path[1]).write_text(config, encoding="utf-8")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"model={path[2]}", "logger=none",
                                                       f"paths.output_dir={tmp_path / 'run'}"])
    spec = validate(cfg)
    assert cfg.model.name == path[2] and spec is not None
    model = build_model(OmegaConf.to_container(cfg.model.architecture), 65)
    assert model.family == "gru" and model.recurrent
    assert_no_other_test_uses({path[2]})
