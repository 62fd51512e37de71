"""Hand-written recurrent layers: the study's GRU, an LSTM and the Elman RNN. `step` is the readable
reference, the formulas as the study writes them; `forward` runs it in a loop, or `fast_sequence`
(`models/fast_recurrence/`), the same function faster. docs/internals.md, *The recurrent layers*.
"""

import math

import torch
from torch import Tensor, nn

from gru_experiments.models import fast_recurrence
from gru_experiments.validation import check_setting

IMPLEMENTATIONS = ("reference", "fast")


class RecurrentLayer(nn.Module):
    """What the layers have in common: parameter init and the time loop."""

    def __init__(self, input_size: int, hidden_size: int, implementation: str = "fast"):
        super().__init__()
        check_setting(implementation in IMPLEMENTATIONS, "implementation", implementation,
                      " or ".join(repr(i) for i in IMPLEMENTATIONS))
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.implementation = implementation
        self.matmul_precision = None  # fast path only: which matmuls take bf16 inputs (precision.py)

    def reset_parameters(self) -> None:
        # PyTorch's recurrent default: every weight and bias uniform in ±1/sqrt(H).
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    # fast_sequence(x, state) -> (outputs, final_state): the same function as the loop over
    # `step`, computed faster; None: this layer has no fast path and runs the loop.
    fast_sequence = None

    def initial_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        return torch.zeros(batch_size, self.hidden_size, device=device, dtype=dtype or self.input_weight.dtype)

    def forward(self, x: Tensor, state=None):
        if state is None:
            state = self.initial_state(x.shape[0], x.device, x.dtype)
        if self.implementation == "fast" and self.fast_sequence is not None:
            return self.fast_sequence(x, state)
        # Unbind once: indexing x[:, t] step by step would make backward quadratic
        # in T (each select's backward materialises a full-size zero tensor).
        outputs = []
        for x_t in x.unbind(1):
            y_t, state = self.step(x_t, state)
            outputs.append(y_t)
        return torch.stack(outputs, 1), state

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, implementation={self.implementation}"


class GRULayer(RecurrentLayer):
    """The study's GRU (deliberately not PyTorch's "reset-after" variant):

        r  = σ(W_rx·x + b_rx + W_rh·h + b_r)
        z  = σ(W_zx·x + b_zx + W_zh·h + b_z)
        h̃  = tanh(W_x·x + b_x + W_h·(r ⊙ h))      reset applied to h *before* W_h
        h' = (1 − z) ⊙ h + z ⊙ h̃

    Hidden-side matmuls carry no bias; r and z each have one extra bias (b_r, b_z)
    beside their input-side bias. Per layer: 3·H·I + 3·H·H + 5·H parameters.

    Parameters are stored packed (all input-side weights in one matrix, rows
    [r | z | candidate]) so that a fast path can project every time step in one
    matmul; `step` unpacks them by name.
    """

    def __init__(self, input_size: int, hidden_size: int, implementation: str = "fast"):
        super().__init__(input_size, hidden_size, implementation)
        H = hidden_size
        self.input_weight = nn.Parameter(torch.empty(3 * H, input_size))  # W_rx; W_zx; W_x
        self.input_bias = nn.Parameter(torch.empty(3 * H))  # b_rx; b_zx; b_x
        self.hidden_weight_rz = nn.Parameter(torch.empty(2 * H, H))  # W_rh; W_zh
        self.hidden_bias_rz = nn.Parameter(torch.empty(2 * H))  # b_r; b_z
        self.hidden_weight_candidate = nn.Parameter(torch.empty(H, H))  # W_h
        self.reset_parameters()

    def step(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        W_rx, W_zx, W_x = self.input_weight.chunk(3)
        b_rx, b_zx, b_x = self.input_bias.chunk(3)
        W_rh, W_zh = self.hidden_weight_rz.chunk(2)
        b_r, b_z = self.hidden_bias_rz.chunk(2)
        W_h = self.hidden_weight_candidate

        r = torch.sigmoid(x @ W_rx.T + b_rx + h @ W_rh.T + b_r)
        z = torch.sigmoid(x @ W_zx.T + b_zx + h @ W_zh.T + b_z)
        h_candidate = torch.tanh(x @ W_x.T + b_x + (r * h) @ W_h.T)
        h_next = (1 - z) * h + z * h_candidate
        return h_next, h_next

    def fast_sequence(self, x: Tensor, h: Tensor):
        return fast_recurrence.gru_sequence(x, h, self.input_weight, self.input_bias, self.hidden_weight_rz,
                                            self.hidden_bias_rz, self.hidden_weight_candidate, self.matmul_precision)


class LSTMLayer(RecurrentLayer):
    """A standard LSTM with one bias per gate, on the input side only:

        i = σ(W_ix·x + b_i + W_ih·h)      input gate
        f = σ(W_fx·x + b_f + W_fh·h)      forget gate
        g = tanh(W_gx·x + b_g + W_gh·h)   candidate
        o = σ(W_ox·x + b_o + W_oh·h)      output gate
        c' = f ⊙ c + i ⊙ g
        h' = o ⊙ tanh(c')

    Per layer: 4·H·I + 4·H·H + 4·H parameters. State is (h, c). `forget_bias` is added to b_f at
    initialisation: 1 starts the forget gate near σ(1) ≈ 0.73 instead of 0.5, so that the cell keeps its memory
    from the first step (Gers et al. 2000; Jozefowicz et al. 2015); 0 leaves PyTorch's initialisation.
    """

    def __init__(self, input_size: int, hidden_size: int, implementation: str = "fast", forget_bias: float = 0.0):
        super().__init__(input_size, hidden_size, implementation)
        H = hidden_size
        self.forget_bias = float(forget_bias)
        self.input_weight = nn.Parameter(torch.empty(4 * H, input_size))  # W_ix; W_fx; W_gx; W_ox
        self.input_bias = nn.Parameter(torch.empty(4 * H))  # b_i; b_f; b_g; b_o
        self.hidden_weight = nn.Parameter(torch.empty(4 * H, H))  # W_ih; W_fh; W_gh; W_oh
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.input_bias[self.hidden_size:2 * self.hidden_size] += self.forget_bias  # b_f

    def initial_state(self, batch_size: int, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        h = super().initial_state(batch_size, device, dtype)
        return h, h.clone()

    def step(self, x: Tensor, state: tuple[Tensor, Tensor]):
        h, c = state
        W_ix, W_fx, W_gx, W_ox = self.input_weight.chunk(4)
        b_i, b_f, b_g, b_o = self.input_bias.chunk(4)
        W_ih, W_fh, W_gh, W_oh = self.hidden_weight.chunk(4)

        i = torch.sigmoid(x @ W_ix.T + b_i + h @ W_ih.T)
        f = torch.sigmoid(x @ W_fx.T + b_f + h @ W_fh.T)
        g = torch.tanh(x @ W_gx.T + b_g + h @ W_gh.T)
        o = torch.sigmoid(x @ W_ox.T + b_o + h @ W_oh.T)
        c_next = f * c + i * g
        h_next = o * torch.tanh(c_next)
        return h_next, (h_next, c_next)

    def fast_sequence(self, x: Tensor, state: tuple[Tensor, Tensor]):
        return fast_recurrence.lstm_sequence(x, state, self.input_weight, self.input_bias, self.hidden_weight,
                                             self.matmul_precision)


class RNNLayer(RecurrentLayer):
    """The Elman RNN:

        h' = tanh(W_x·x + b + W_h·h)

    One bias (PyTorch's built-in Elman layer has two, b_ih and b_hh, which add up to one). Per layer:
    H·I + H·H + H parameters.
    """

    def __init__(self, input_size: int, hidden_size: int, implementation: str = "fast"):
        super().__init__(input_size, hidden_size, implementation)
        H = hidden_size
        self.input_weight = nn.Parameter(torch.empty(H, input_size))  # W_x
        self.input_bias = nn.Parameter(torch.empty(H))  # b
        self.hidden_weight = nn.Parameter(torch.empty(H, H))  # W_h
        self.reset_parameters()

    def step(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        h_next = torch.tanh(x @ self.input_weight.T + self.input_bias + h @ self.hidden_weight.T)
        return h_next, h_next

    def fast_sequence(self, x: Tensor, h: Tensor):
        return fast_recurrence.rnn_sequence(x, h, self.input_weight, self.input_bias, self.hidden_weight,
                                            self.matmul_precision)


CELLS = {"gru": GRULayer, "lstm": LSTMLayer, "rnn": RNNLayer}
