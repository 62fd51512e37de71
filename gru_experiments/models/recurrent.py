"""The stacked recurrent language model of every GRU, LSTM and Elman RNN config. Its state, one entry per layer
(None: zeros), fed back in continues the sequence exactly (docs/internals.md, *The recurrent layers*).
"""

from torch import Tensor, nn

from gru_experiments.models.cells import CELLS
from gru_experiments.models.precision import MatmulPrecision, linear
from gru_experiments.models.protocol import LayeredLM
from gru_experiments.validation import check_dropout, check_ints, check_setting


class RecurrentLM(LayeredLM):
    def __init__(self, vocab_size: int, cell: str = "gru", embedding_dim: int = 64, hidden_size: int = 128,
                 num_layers: int = 1, dropout: float = 0.1, layer_norm: bool = False, implementation: str = "fast",
                 forget_bias: float = 0.0):
        super().__init__()
        check_setting(cell in CELLS, "cell", cell, " or ".join(repr(c) for c in CELLS))
        check_ints(embedding_dim=embedding_dim, hidden_size=hidden_size, num_layers=num_layers)
        check_dropout(dropout)  # the implementation: the layers check it
        check_setting(isinstance(forget_bias, (int, float)) and not isinstance(forget_bias, bool)
                      and (cell == "lstm" or forget_bias == 0), "forget_bias", forget_bias,
                      "a number, added to the LSTM's forget-gate bias (0 for the GRU and the RNN, which have none)")
        self.cell = cell
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        gate = {"forget_bias": forget_bias} if cell == "lstm" else {}
        self.layers = nn.ModuleList(CELLS[cell](embedding_dim if i == 0 else hidden_size, hidden_size, implementation,
                                                **gate) for i in range(num_layers))
        # Dropout on each layer's output sequence: between layers, and before the head.
        # The recurrent state itself is never dropped.
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(hidden_size) if layer_norm else nn.Identity()
        self.head = nn.Linear(hidden_size, vocab_size)
        self.matmul_precision: MatmulPrecision | None = None

    def set_matmul_precision(self, precision: MatmulPrecision | None) -> None:
        """bf16 matmul inputs in the fast recurrent layers and the head for the weights `precision` picks (the
        embedding is a lookup); None: the parameters' dtype throughout."""
        self.matmul_precision = precision
        for layer in self.layers:
            layer.matmul_precision = precision

    def low_precision_weights(self) -> list[str]:
        if self.matmul_precision is None:
            return []
        names = []
        for i, layer in enumerate(self.layers):
            if layer.implementation == "fast" and layer.fast_sequence is not None:
                names += [f"layers.{i}.{n}" for n, p in layer.named_parameters()
                          if p.dim() == 2 and self.matmul_precision.for_weight(p) is not None]
        if self.matmul_precision.for_weight(self.head.weight) is not None:
            names.append("head.weight")
        return names

    def forward_features(self, tokens: Tensor, state: list | None = None) -> tuple[Tensor, list, Tensor]:
        """tokens (B, T) -> logits (B, T, vocab), new state (one entry per layer), the head's input (B, T, H): the
        last layer's output after `norm`."""
        x = self.embedding(tokens)
        new_state = []
        for layer, layer_state in zip(self.layers, state or [None] * len(self.layers)):
            x, layer_state = layer(x, layer_state)
            x = self.dropout(x)
            new_state.append(layer_state)
        x = self.norm(x)
        return linear(x, self.head.weight, self.head.bias, self.matmul_precision), new_state, x
