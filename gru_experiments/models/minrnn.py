"""Feng et al. (2024), "Were RNNs All We Needed?": minGRU and minLSTM, the ladder's rung past the LSTM. Their
gates and candidate read the input only, so h_t = a_t ⊙ h_{t−1} + b_t and a sequence runs as one scan in log
space. Per layer, k = W·x + bias:

    minGRU   z = σ(k_z)                            h' = (1 − z) ⊙ h + z ⊙ g(k_h)
    minLSTM  f = σ(k_f), i = σ(k_i)                h' = f/(f + i) ⊙ h + i/(f + i) ⊙ g(k_h)
    g(x) = x + 0.5 for x ≥ 0, σ(x) for x < 0       (the candidate h̃ = g(k_h) is always positive)

The stack and what differs from the paper: docs/internals.md, *minGRU and minLSTM*.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gru_experiments.models.protocol import LayeredLM
from gru_experiments.validation import check_dropout, check_ints, check_setting

CELLS = ("mingru", "minlstm")
SCAN_CHUNK = 32  # steps per scan, the state carried: |cumsum log a| stays small, and so float32 rounding in log space


def g(x: Tensor) -> Tensor:
    """The paper's positive activation of the candidate: x + 0.5 (x ≥ 0), σ(x) (x < 0)."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_g(x: Tensor) -> Tensor:
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


def log_scan(log_a: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    """Every h_t (B, T, H) of h_t = a_t ⊙ h_{t−1} + b_t from log a, log b (B, T, H), b > 0, and h_0 (B, H) of any
    sign: h_t = A_t ⊙ (h_0 + Σ_{k≤t} b_k / A_k) with A_t = Π_{k≤t} a_k, the sum in log space (Heinsen 2023), the
    h_0 term outside it."""
    a_star = log_a.cumsum(1)  # log A_t
    return torch.exp(a_star + torch.logcumsumexp(log_b - a_star, 1)) + torch.exp(a_star) * h0.unsqueeze(1)


class MinRNNLayer(nn.Module):
    """One minGRU or minLSTM layer. One packed linear map of the input, rows [k_h | k_z] (minGRU) or
    [k_h | k_f | k_i] (minLSTM), each with a bias: (2 or 3)·H·(I + 1) parameters."""

    def __init__(self, cell: str, input_size: int, hidden_size: int):
        super().__init__()
        check_setting(cell in CELLS, "cell", cell, " or ".join(repr(c) for c in CELLS))
        self.cell, self.hidden_size = cell, hidden_size
        self.linear = nn.Linear(input_size, (2 if cell == "mingru" else 3) * hidden_size)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        return torch.zeros(batch_size, self.hidden_size, device=device, dtype=dtype or self.linear.weight.dtype)

    def step(self, x: Tensor, h: Tensor) -> Tensor:
        """One time step, the readable reference: x (B, I), h (B, H) -> h' (B, H)."""
        if self.cell == "mingru":
            k_h, k_z = self.linear(x).chunk(2, -1)
            z = torch.sigmoid(k_z)
            return (1 - z) * h + z * g(k_h)
        k_h, k_f, k_i = self.linear(x).chunk(3, -1)
        f, i = torch.sigmoid(k_f), torch.sigmoid(k_i)
        return f / (f + i) * h + i / (f + i) * g(k_h)

    def log_coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """log a_t, log b_t of h_t = a_t ⊙ h_{t−1} + b_t for every step of x (B, T, I): the step's
        formulas in log space (log σ(k) = −softplus(−k), log(1 − σ(k)) = −softplus(k))."""
        if self.cell == "mingru":
            k_h, k_z = self.linear(x).chunk(2, -1)
            return -F.softplus(k_z), -F.softplus(-k_z) + log_g(k_h)  # log(1 − z), log z + log h̃
        k_h, k_f, k_i = self.linear(x).chunk(3, -1)
        log_i_over_f = F.softplus(-k_f) - F.softplus(-k_i)  # log i − log f
        # log f/(f + i) = −log(1 + i/f), log i/(f + i) = −log(1 + f/i)
        return -F.softplus(log_i_over_f), -F.softplus(-log_i_over_f) + log_g(k_h)

    def sequential(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, I) from h (B, H) one step at a time: (outputs (B, T, H), final state)."""
        outputs = []
        for x_t in x.unbind(1):
            h = self.step(x_t, h)
            outputs.append(h)
        return torch.stack(outputs, 1), h

    def scan(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """`sequential`, every step at once (in chunks of SCAN_CHUNK steps)."""
        log_a, log_b = self.log_coefficients(x)
        outputs = []
        for start in range(0, x.shape[1], SCAN_CHUNK):
            chunk = slice(start, start + SCAN_CHUNK)
            outputs.append(log_scan(log_a[:, chunk], log_b[:, chunk], h))
            h = outputs[-1][:, -1]
        return torch.cat(outputs, 1), h

    def forward(self, x: Tensor, h: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x (B, T, I) -> (outputs (B, T, H), final state): one token a step (sampling), else the scan."""
        if h is None:
            h = self.initial_state(x.shape[0], x.device, x.dtype)
        if x.shape[1] == 1:
            h = self.step(x[:, 0], h)
            return h.unsqueeze(1), h
        return self.scan(x, h)

    def extra_repr(self) -> str:
        return f"{self.cell}, {self.linear.in_features}, {self.hidden_size}"


class MinRNNLM(LayeredLM):
    """tokens -> embedding -> pre-LayerNorm residual minGRU/minLSTM layers -> LayerNorm -> head."""

    def __init__(self, vocab_size: int, cell: str = "mingru", embedding_dim: int = 109, hidden_size: int = 109,
                 num_layers: int = 3, dropout: float = 0.1):
        super().__init__()
        check_ints(embedding_dim=embedding_dim, hidden_size=hidden_size, num_layers=num_layers)
        check_dropout(dropout)  # the cell: MinRNNLayer checks it
        self.cell = cell
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        inputs = [embedding_dim] + [hidden_size] * (num_layers - 1)
        self.norms = nn.ModuleList(nn.LayerNorm(n) for n in inputs)
        self.layers = nn.ModuleList(MinRNNLayer(cell, n, hidden_size) for n in inputs)
        self.dropout = nn.Dropout(dropout)  # on each layer's output, before the residual sum; never on the state
        self.norm = nn.LayerNorm(hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward_features(self, tokens: Tensor, state: list | None = None) -> tuple[Tensor, list, Tensor]:
        """tokens (B, T) -> logits (B, T, vocab), new state (one (B, H) tensor per layer), the head's input
        (B, T, H): the final LayerNorm's output."""
        x = self.embedding(tokens)
        new_state = []
        for norm, layer, h in zip(self.norms, self.layers, state or [None] * len(self.layers)):
            y, h = layer(norm(x), h)
            y = self.dropout(y)
            x = x + y if x.shape[-1] == y.shape[-1] else y
            new_state.append(h)
        x = self.norm(x)
        return self.head(x), new_state, x
