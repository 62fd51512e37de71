"""Bengio et al. (2003), "A Neural Probabilistic Language Model": the ladder's feed-forward rung over the last k
tokens (`ContextWindow`), positions before the first token read a learned "no token" embedding. The formula:
docs/internals.md, *The MLP*.
"""

import torch
from torch import Tensor, nn

from gru_experiments.models.protocol import ContextWindow, FiniteContextLM
from gru_experiments.validation import check_dropout, check_ints, check_setting


class BengioMLP(FiniteContextLM):
    family = "mlp"

    def __init__(self, vocab_size: int, context: int = 16, embedding_dim: int = 16, hidden_size: int = 266,
                 dropout: float = 0.1, direct: bool = False):
        super().__init__()
        check_ints(context=context, embedding_dim=embedding_dim, hidden_size=hidden_size)
        check_dropout(dropout)
        check_setting(isinstance(direct, bool), "direct", direct, "true or false")
        self.window = ContextWindow(context)
        self.embedding = nn.Embedding(vocab_size + 1, embedding_dim)  # C; row V: "no token"
        self.hidden = nn.Linear(context * embedding_dim, hidden_size)  # H, d
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_size, vocab_size)  # U, b
        self.direct = nn.Linear(context * embedding_dim, vocab_size, bias=False) if direct else None  # W

    @property
    def vocab_size(self) -> int:
        return self.head.out_features

    def forward_features(self, tokens: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (B, T) -> logits (B, T, V), the last k tokens, the head's input (B, T, hidden)."""
        history, new_state = self.window.extend(tokens, state)  # (B, k + T)
        B, T = tokens.shape
        k = self.context
        embedded = self.embedding(history.masked_fill(history < 0, self.vocab_size))  # (B, k + T, e)
        # Window j + 1 of k consecutive embeddings ends at token j: (B, T, e, k) -> (B, T, k · e), oldest first.
        x = embedded.unfold(1, k, 1)[:, 1:].transpose(2, 3).reshape(B, T, -1)
        features = self.dropout(torch.tanh(self.hidden(x)))
        logits = self.head(features)
        if self.direct is not None:
            logits = logits + self.direct(x)
        return logits, new_state, features
