"""Scoring a model on a whole split: NLL per token and bits per character.

Bits per character makes char and subword models comparable: the split's total
NLL (in bits) divided by the number of characters its scored tokens decode to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gru_experiments.data import IGNORE_INDEX, EvalBatches


@dataclass
class Score:
    nll_sum: float = 0.0  # nats, summed over scored tokens
    tokens: int = 0
    characters: int = 0

    def add(self, other: "Score") -> "Score":
        return Score(self.nll_sum + other.nll_sum, self.tokens + other.tokens, self.characters + other.characters)

    @property
    def nll(self) -> float:
        """Mean NLL per token, in nats."""
        return self.nll_sum / max(self.tokens, 1)

    @property
    def bpc(self) -> float:
        return self.nll_sum / math.log(2) / max(self.characters, 1)


def score_batch(logits: Tensor, targets: Tensor, token_char_lengths: Tensor) -> Score:
    """Summed NLL of logits (..., V) against targets (...), IGNORE_INDEX positions skipped."""
    nll_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                              ignore_index=IGNORE_INDEX, reduction="sum")
    scored = targets[targets != IGNORE_INDEX]
    return Score(nll_sum.item(), scored.numel(), int(token_char_lengths.to(scored.device)[scored].sum().item()))


@torch.no_grad()
def score_windows(model, ids: Tensor, seq_len: int, batch_size: int, token_char_lengths: Tensor) -> Score:
    """Every target of `ids` predicted from the previous tokens of its window, from a zero state."""
    was_training = model.training
    model.eval()
    total = Score()
    for inputs, targets in EvalBatches(ids, batch_size, seq_len):
        logits, _ = model(inputs)
        total = total.add(score_batch(logits, targets, token_char_lengths))
    model.train(was_training)
    return total
