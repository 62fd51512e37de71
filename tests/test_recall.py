"""The recall figures (study/recall.py) against models whose answers are known (an oracle, a uniform guesser), a
finite-context model's stateful recall scored per target, the horizon of a hand-made recall curve, a training with
the probe writing them, and a small GRU that learns to recall when the schedule is dense (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from evaluation_helpers import forward_tokens_run
from robustness_helpers import train

from gru_experiments.data.recall_probe import Pairs, Planting, SymbolIds, plant, planting_generator
from gru_experiments.models.protocol import LanguageModel
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.recall import horizon, recall_forward_tokens, score_recall

V, K, OPEN, CLOSE = 24, 4, 20, 21  # ids 0..19: text; 20, 21: the markers; 22, 23 and 0, 1: keys (any ids)
KEYS = torch.tensor([22, 23, 0, 1])


class RecallOracle(LanguageModel):
    """Remembers the key after the last opening marker it saw (its state) and, after a closing marker,
    puts all its probability on that key (`knows`), or spreads it evenly over the K keys (a uniform
    guesser, knows=False); elsewhere it is uniform over the vocabulary."""

    def __init__(self, knows: bool = True):
        super().__init__()
        self.knows = knows
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # a device to report

    @property
    def vocab_size(self) -> int:
        return V

    def initial_state(self, batch_size: int, device=None):
        return (torch.full((batch_size,), -1, dtype=torch.long), torch.zeros(batch_size, dtype=torch.bool))

    def forward(self, tokens, state=None):
        key, after_open = state if state is not None else self.initial_state(tokens.shape[0])
        key, after_open = key.clone(), after_open.clone()
        logits = torch.zeros(*tokens.shape, V)
        for t in range(tokens.shape[1]):
            token = tokens[:, t]
            key = torch.where(after_open, token, key)  # the token after an opening marker is the key
            after_open = token == OPEN
            for row in torch.nonzero(token == CLOSE).squeeze(1).tolist():
                logits[row, t] = -1e9
                if self.knows and key[row] >= 0:
                    logits[row, t, key[row]] = 0.0
                else:
                    logits[row, t, KEYS] = 0.0
        return logits, (key, after_open)


def plantings(n: int = 3, length: int = 3000) -> list[Planting]:
    settings = Pairs((8, 40, 160), gap=16)
    text = torch.randint(20, (length,), generator=torch.Generator().manual_seed(0))
    return [plant(text, settings, SymbolIds(OPEN, CLOSE, KEYS), planting_generator(0, "validation", p), cut=True)
            for p in range(n)]  # cut to the split's length, as validation_plantings plants


@pytest.mark.parametrize("seq_len", [7, 64])
def test_an_oracle_recalls_in_0_bits_and_a_uniform_guesser_in_log2_k(seq_len):
    planted = plantings()
    oracle = score_recall(RecallOracle(knows=True), planted, seq_len=seq_len, window=50, keys=K)
    guesser = score_recall(RecallOracle(knows=False), planted, seq_len=seq_len, window=50, keys=K)
    assert oracle["distances"] == [8, 40, 160] and oracle["chance_bits"] == 2.0
    for d, figures in oracle["by_distance"].items():
        # stateful: the state carries the key across every chunk boundary, whatever the distance
        assert figures["stateful"]["bits"] == pytest.approx(0.0, abs=1e-6) and figures["stateful"]["targets"] >= 10
        # windowed at 50: the first key is inside the window at 8 and 40 (d + 2 back), outside at 160
        expected = 0.0 if int(d) + 2 <= 50 else math.log2(K)
        assert figures["windowed"]["bits"] == pytest.approx(expected, abs=1e-6)
        # stateless: the closing marker alone
        assert figures["stateless"]["bits"] == pytest.approx(math.log2(K), abs=1e-6)
        for mode in ("stateful", "windowed", "stateless"):
            assert guesser["by_distance"][d][mode]["bits"] == pytest.approx(math.log2(K), abs=1e-6)
    assert sum(f["stateful"]["targets"] for f in oracle["by_distance"].values()) == sum(p.recall.numel()
                                                                                      for p in planted)


def test_a_trained_shape_model_gives_finite_recall_bits_with_standard_errors():
    model = RecurrentLM(V, "gru", embedding_dim=4, hidden_size=8, num_layers=1)
    with forward_tokens_run(model) as counted:
        record = score_recall(model, plantings(2), seq_len=32, window=32, keys=K)
    for figures in record["by_distance"].values():
        for mode in ("stateful", "windowed", "stateless"):
            assert math.isfinite(figures[mode]["bits"]) and figures[mode]["se"] > 0
    assert record["forward_tokens"] > 2 * 3000 and "unplanted" in record["note"]
    # The plan counts them before anything runs (recall.RecallPass: the recall figures are part of it).
    assert record["forward_tokens"] == recall_forward_tokens(model, plantings(2), 32, 32) == sum(counted)


def test_training_with_the_probe_writes_the_recall_figures(compose_config, small_shakespeare):
    cfg = compose_config(f"data.path={small_shakespeare}", "probe=recall",
                         "probe.validation.distances=[8,24,64]", "probe.validation.min_targets=20",
                         "probe.validation.gap=16", "data.batch_size=4", "data.seq_len=16",
                         "trainer.max_steps=3", "model.steps_per_epoch=3", "trainer.enable_progress_bar=false",
                         "evaluation.text.samples=0", "evaluation.curve_longest=64")
    train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    recall = summary["recall"]
    assert summary["probe"] == "recall" and recall["keys"] == 16 and recall["distances"] == [8, 24, 64]
    assert recall["window"] == 16 and recall["seq_len"] == 16 and recall["chance_bits"] == 4.0
    for figures in recall["by_distance"].values():
        assert figures["stateful"]["targets"] >= 20
        assert all(math.isfinite(figures[mode]["bits"]) for mode in ("stateful", "windowed", "stateless"))
    assert set(recall["horizon"]) == {"stateful", "windowed", "stateless"}
    assert "unplanted" in recall["note"] and "by_class" in summary["context_curve"]
    assert "text" not in summary  # evaluation.text.samples=0
    # The recall figures are part of the run's plan: the forward tokens scored are those it planned.
    [planned] = [row for row in summary["mode_evaluation"]["plan"] if row["name"] == "recall"]
    assert planned["forward_tokens"] == recall["forward_tokens"] > 0


def curve(*points) -> dict:
    return {str(d): {"stateful": {"bits": bits}} for d, bits in points}


def test_the_horizon_of_a_hand_made_recall_curve():
    # under 1 bit up to 64 (128 is 1.5), 2 bits crossed between 128 (1.5) and 256 (3.5): a quarter of the way
    # in log2 distance, 2 ** (7 + 0.25)
    made = curve((8, 0.1), (16, 0.2), (32, 0.4), (64, 0.9), (128, 1.5), (256, 3.5), (512, 4.0), (1024, 0.5))
    assert horizon(made, "stateful") == {"remembered": 64, "crosses_2_bits": pytest.approx(2 ** 7.25),
                                         "crossing": "interpolated in log2 distance"}
    # the later dip under 1 bit at 1024 does not extend the horizon: every distance up to it must be under
    assert horizon(curve((8, 1.2), (16, 0.1)), "stateful") == {
        "remembered": None, "crosses_2_bits": None, "crossing": "below 2 bits at every distance"}
    assert horizon(curve((8, 2.5), (16, 4.0)), "stateful")["crossing"] == "2 bits or more at the shortest distance"
    assert horizon(curve((16, 0.0), (8, 0.0)), "stateful")["remembered"] == 16  # read in order of distance
    exactly = horizon(curve((8, 1.0), (16, 2.0)), "stateful")
    assert exactly["remembered"] is None and exactly["crosses_2_bits"] == pytest.approx(16.0)


def test_a_finite_context_models_stateful_recall_is_its_last_context_tokens_scored_per_target():
    """The transformer's stateful recall is scored per target from its last block_size tokens (cheap: no
    pass per position of every planting); it equals carrying the state through the plantings."""
    from gru_experiments.models.transformer import TransformerLM
    from gru_experiments.study.recall import stateful_log_probs, windowed_log_probs

    torch.manual_seed(0)
    model = TransformerLM(vocab_size=24, block_size=12, embedding_dim=16, num_layers=1, num_heads=2, dropout=0.0)
    planted = plantings(n=2, length=400)
    ids = torch.stack([p.ids for p in planted])
    rows = torch.cat([torch.full_like(p.recall, r) for r, p in enumerate(planted)])
    positions = torch.cat([p.recall for p in planted])
    carried = stateful_log_probs(model, ids, rows, positions, seq_len=7)
    per_target = windowed_log_probs(model, ids, rows, positions, model.context)
    assert torch.allclose(carried, per_target, atol=1e-5)
    with forward_tokens_run(model) as counted:
        record = score_recall(model, planted, seq_len=7, window=5, keys=K)
    assert record["forward_tokens"] < ids.numel() * model.context  # not a pass over a block per position
    assert record["forward_tokens"] == recall_forward_tokens(model, planted, 7, 5) == sum(counted)


# --- learning to recall: the schedule decides --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("schedule, learns", [
    ("[{start: 0.0, distances: [4, 8], gap: 2}]", True),  # dense and short: learned within the budget
    ("[{start: 0.0, distances: [16, 48, 96], gap: 64}]", False),  # the first, sparse schedule: a plateau at log2 K
])
def test_a_small_gru_learns_to_recall_at_short_distance_when_the_schedule_is_dense(
        compose_config, small_shakespeare, schedule, learns):
    """A 64/128 GRU, 300 steps of 32 x 64 on 60k characters: the dense schedule teaches it to recall a key 8
    characters back (stateful and windowed under 1 bit); the sparse one does not (both near log2 K = 4)."""
    cfg = compose_config(f"data.path={small_shakespeare}", "probe=recall", f"probe.phases={schedule}",
                         "probe.validation.distances=[8]", "probe.validation.min_targets=200", "data.batch_size=32",
                         "data.seq_len=64", "model.steps_per_epoch=100", "model.epochs=3",
                         "trainer.enable_progress_bar=false", "evaluation.text.samples=0",
                         "evaluation.curve_longest=64", "evaluation.budget=0.2")
    figures = train(cfg)["recall"]["by_distance"]["8"]
    assert figures["stateless"]["bits"] > 3.5  # the closing marker alone says nothing of the key
    for mode in ("stateful", "windowed"):
        assert (figures[mode]["bits"] < 1.0) == learns, (mode, figures[mode])
