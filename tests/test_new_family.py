"""A family added as a newcomer adds one: a module against models/protocol.py as it stands, named by a config's
`_target_`, nothing else changed. It trains, its summary says it is recurrent, every report section counts it
as recurrent, and its run's page shows its units (as minGRU's and minLSTM's do)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict
from robustness_helpers import train
from test_report import make_job
from torch import Tensor, nn

from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.minrnn import MinRNNLM
from gru_experiments.models.protocol import LanguageModel, build_model
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.report.report import build_report
from gru_experiments.report.sweep_folder import collect
from gru_experiments.study.explore import explore, layer_sizes


class IndRNNLM(LanguageModel):
    """Li et al. (2018), IndRNN: per layer h' = relu(W x + u ⊙ h + b), each unit its own recurrent weight u.
    The protocol's five members and nothing more: its state one (B, H) tensor per layer."""

    family = "indrnn"

    def __init__(self, vocab_size: int, embedding_dim: int = 8, hidden_size: int = 12, num_layers: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.inputs = nn.ModuleList(nn.Linear(embedding_dim if i == 0 else hidden_size, hidden_size)
                                    for i in range(num_layers))
        self.recurrences = nn.ParameterList(nn.Parameter(0.5 * torch.rand(hidden_size)) for _ in range(num_layers))
        self.head = nn.Linear(hidden_size, vocab_size)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def initial_state(self, batch_size: int, device=None) -> list[Tensor]:
        return [torch.zeros(batch_size, linear.out_features, device=device) for linear in self.inputs]

    def forward(self, tokens: Tensor, state: list | None = None) -> tuple[Tensor, list]:
        state = list(state) if state is not None else self.initial_state(tokens.shape[0], tokens.device)
        x = self.embedding(tokens)
        for i, (linear, u) in enumerate(zip(self.inputs, self.recurrences)):
            projected, outputs = linear(x), []
            for t in range(tokens.shape[1]):
                state[i] = torch.relu(projected[:, t] + u * state[i])
                outputs.append(state[i])
            x = torch.stack(outputs, 1)
        return self.head(x), state


# Where a newcomer puts a family: a module of gru_experiments/models/ (the only place a run folder may name a model
# class from: runs/run_contents.py), stood in for by this one under that name.
FAMILY_MODULE = "gru_experiments.models.indrnn"
sys.modules[FAMILY_MODULE] = sys.modules[__name__]
ARCHITECTURE = {"_target_": f"{FAMILY_MODULE}.IndRNNLM", "embedding_dim": 8, "hidden_size": 12, "num_layers": 2}
TEXT = "KING: Now is the winter of our discontent\nmade \"glorious summer\" by this sun of York;\n" * 4


def test_the_protocol_says_it_is_recurrent_and_shows_its_units():
    tokenizer = CharTokenizer.from_text(TEXT)
    ids = torch.tensor(tokenizer.encode(TEXT))
    torch.manual_seed(0)
    model = build_model(OmegaConf.create(ARCHITECTURE), tokenizer.vocab_size)
    assert model.recurrent and layer_sizes(model) == [12, 12]
    # The default unit_states steps one token at a time: its logits and final state are forward's.
    logits, state, units = model.unit_states(ids[None, :20])
    whole, whole_state = model(ids[None, :20])
    assert torch.allclose(logits, whole, atol=1e-6) and [u.shape for u in units] == [(1, 20, 12)] * 2
    assert all(torch.allclose(u[:, -1], s, atol=1e-6) for u, s in zip(units, whole_state))
    data = explore(model.eval(), tokenizer, ids, seq_len=32, window=16)
    assert data["layers"] == [12, 12] and data["rankings"] and data["activations"].shape == (len(ids), 24)


@pytest.mark.parametrize("model", [RecurrentLM(11, "gru", 4, 6, num_layers=2), RecurrentLM(11, "lstm", 4, 5),
                                   MinRNNLM(11, "mingru", 4, 6, num_layers=2), MinRNNLM(11, "minlstm", 4, 5)],
                         ids=["gru", "lstm", "mingru", "minlstm"])
def test_a_family_that_runs_its_units_at_once_agrees_with_the_protocol(model):
    """RecurrentLM and MinRNNLM read every step's units from their layers' outputs: the protocol's default,
    one token at a time, gives the same; their pages show units."""
    model = model.double().eval()  # float64: the scan and the steps agree to rounding
    tokens = torch.randint(0, 11, (2, 40))
    logits, state, units = model.unit_states(tokens)
    step_logits, step_state, step_units = LanguageModel.unit_states(model, tokens)
    assert torch.allclose(logits, step_logits, atol=1e-9)
    assert [u.shape for u in units] == [u.shape for u in step_units] and layer_sizes(model)
    assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(units, step_units))


def test_it_trains_and_its_summary_says_recurrent(compose_config, tiny_corpus):
    cfg = compose_config(f"data.path={tiny_corpus}", "data.batch_size=2", "data.seq_len=16", "trainer.max_steps=1",
                         "++model.steps_per_epoch=1", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu")
    with open_dict(cfg):
        cfg.model.architecture = ARCHITECTURE
    summary = train(cfg)
    on_disk = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["family"] == on_disk["family"] == "indrnn" and on_disk["recurrent"] is True
    assert on_disk["context"] is None


def scale_summary(model: str, parameters: int, **changes) -> dict:
    """A completed run's summary.json with what every section reads (the stateful gain grows with size)."""
    stateful, gain = 2.0 - parameters / 1e6, -parameters / 1e7
    return {"status": "completed", "model": model, "family": "indrnn", "tokenizer": "char", "context": None,
            "recurrent": True, "parameters": parameters, "train_steps": 200, "train_seconds": 60.0, "seq_len": 128,
            "train_loss": 1.5, "val_loss": 1.5, "val_bpc": stateful + 0.05, "stateful_bpc": stateful,
            "stateful_bpc_se": 0.01, "stateful_nll": stateful * 0.693, "windowed_bpc": stateful - gain,
            "windowed_bpc_se": 0.02, "stateless_bpc": 3.6, "stateless_bpc_se": 0.005, "bigram_bpc": 3.58,
            "bigram_bpc_se": 0.005, "state_gain_bpc": gain, "state_gain_se": 0.001,
            "context_curve": {"1": 3.6, "128": stateful - gain, "stateful": stateful},
            "best": {"step": 200, "val_bpc": stateful}, **changes}


def test_every_report_section_counts_it_as_recurrent(tmp_path):
    """Two sizes of the new family: one summary says recurrent, an older one only its null context; a third
    job never finished and has only its config. Findings, the scale section and the text report count them."""
    sweep = tmp_path / "sweep"
    history = [(10, 0, "train/loss", 3.9), (100, 0, "val/stateful_word_validity", 0.6),
               (100, 0, "val/stateless_word_validity", 0.1), (200, 0, "val/stateful_word_validity", 0.9),
               (200, 0, "val/stateless_word_validity", 0.3)]
    old = scale_summary("indrnn_big", 500_000)
    del old["recurrent"]
    for num, summary in enumerate([scale_summary("indrnn_small", 50_000), old, None]):
        job = make_job(sweep, num, summary["model"] if summary else "indrnn_running", summary=summary,
                       history=history if summary else None)
        config = OmegaConf.load(job / ".hydra" / "config.yaml")
        config.model.architecture = ARCHITECTURE
        OmegaConf.save(config, job / ".hydra" / "config.yaml")
    jobs, _ = collect(sweep)
    assert [job.recurrent for job in jobs] == [True, True, True]
    text = build_report(sweep).files["report.md"].read_text()
    assert "worse than the count bigram for 2 of 2 recurrent models" in text  # findings
    scale = text.split("## Scale: the models by size", 1)[1].split("\n## ", 1)[0]  # the scale section
    assert "| indrnn_small" in scale and "| indrnn_big" in scale
    assert "It is for 2 of 2 recurrent models." in text  # the text report's finding
