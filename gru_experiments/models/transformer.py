"""A decoder-only transformer in nanoGPT's form: the GRU's rival. Its state is its last `block_size` tokens;
past the block each prediction is a pass of its own (`forward_cost`). docs/transformer.md.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gru_experiments.models.protocol import NO_TOKEN, WINDOW_BATCH_TOKENS, ContextWindow, FiniteContextLM
from gru_experiments.validation import check_dropout, check_ints, check_setting


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, bias: bool, attention_dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)  # nanoGPT's c_attn: query, key, value at once
        self.proj = nn.Linear(width, width, bias=bias)
        self.dropout = attention_dropout  # on the attention weights (nanoGPT's attn_dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """bias: ALiBi's (h, T, T) added to the scores, the causal mask inside it; None, plain causal attention."""
        N, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(N, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (N, h, T, d)
        if bias is not None:  # (N, h, T, T): CPU's fused kernel takes a 4-D mask, 2x the speed of a 3-D one
            bias = bias.expand(N, -1, -1, -1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=bias is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(N, T, C)))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float, bias: bool):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width, bias=bias)
        self.proj = nn.Linear(4 * width, width, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, bias: bool, attention_dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, bias=bias)
        self.attention = CausalSelfAttention(width, heads, dropout, bias, attention_dropout)
        self.ln_2 = nn.LayerNorm(width, bias=bias)
        self.mlp = MLP(width, dropout, bias)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        x = x + self.attention(self.ln_1(x), bias)
        return x + self.mlp(self.ln_2(x))


def alibi_bias(heads: int, length: int, device=None) -> Tensor:
    """ALiBi (Press et al. 2022): head h's score for a key d positions back is lowered by d * 2^(-8(h+1)/heads);
    keys ahead get -inf (the causal mask). (heads, length, length)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device) / heads)
    position = torch.arange(length, device=device)
    distance = (position[:, None] - position[None, :]).float()  # query - key
    return (-slopes[:, None, None] * distance).masked_fill(distance < 0, float("-inf"))


class TransformerLM(FiniteContextLM):
    family = "transformer"

    def __init__(self, vocab_size: int, block_size: int = 128, embedding_dim: int = 40, num_layers: int = 4,
                 num_heads: int = 4, dropout: float = 0.1, bias: bool = False, attention_dropout: float | None = None,
                 tie_head: bool = True, positions: str = "learned"):
        """attention_dropout: None is `dropout` (nanoGPT's); above 0, half the speed on CPU (the unfused path).
        tie_head: the head shares the token embeddings' weights (nanoGPT's). positions: "learned", a table of
        block_size vectors (nanoGPT's); "alibi", none, each head's scores lowered by the key's distance instead
        (docs/transformer.md: at 40 wide a learned table of 1,024 positions does not train in 2,000 steps)."""
        super().__init__()
        check_ints(block_size=block_size, embedding_dim=embedding_dim, num_layers=num_layers, num_heads=num_heads)
        check_setting(embedding_dim % num_heads == 0, "num_heads", num_heads,
                      f"a divisor of embedding_dim ({embedding_dim})")
        check_dropout(dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        check_dropout(attention_dropout, "attention_dropout")
        check_setting(isinstance(bias, bool), "bias", bias, "true or false")
        check_setting(isinstance(tie_head, bool), "tie_head", tie_head, "true or false")
        check_setting(positions in ("learned", "alibi"), "positions", positions, "learned or alibi")
        self.window = ContextWindow(block_size)
        self.wte = nn.Embedding(vocab_size, embedding_dim)
        self.wpe = nn.Embedding(block_size, embedding_dim) if positions == "learned" else None
        self.heads = num_heads
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(embedding_dim, num_heads, dropout, bias, attention_dropout)
                                    for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(embedding_dim, bias=bias)
        self.head = nn.Linear(embedding_dim, vocab_size, bias=False)
        if tie_head:
            self.head.weight = self.wte.weight  # weight tying (nanoGPT's)
        # nanoGPT's initialisation: N(0, 0.02), zero biases, the residual projections scaled by depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * num_layers))

    @property
    def vocab_size(self) -> int:
        return self.wte.num_embeddings

    def forward_cost(self, seen: int, new: int) -> int:
        """One causal pass while every position sees all before it; past the block, a block a prediction."""
        seen = min(seen, self.context)
        return seen + new if seen + new <= self.context else new * self.context

    def forward_features(self, tokens: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (B, T) -> logits (B, T, V), the last block_size tokens, the head's input (B, T, C): `ln_f`'s
        output over the last block."""
        history, new_state = self.window.extend(tokens, state)  # (B, block + T), NO_TOKEN-padded on the left
        B, T = tokens.shape
        if tokens.numel() == 0:  # no rows or no tokens (an empty batch of windows)
            features = self.wte.weight.new_zeros(B, T, self.wte.embedding_dim)
            return self.wte.weight.new_zeros(B, T, self.vocab_size), new_state, features
        if int((history != NO_TOKEN).sum(1).max()) <= self.context:  # everything in view of every position
            logits, features = self.predict_last(history, T)  # one pass
        else:
            windows = history.unfold(1, self.context, 1)[:, 1:].reshape(B * T, self.context)  # position t's window
            step = max(1, WINDOW_BATCH_TOKENS // self.context)
            parts = [self.predict_last(part, 1) for part in windows.split(step)]
            logits, features = (torch.cat(outputs).view(B, T, -1) for outputs in zip(*parts))
        return logits, new_state, features

    def predict_last(self, rows: Tensor, count: int) -> tuple[Tensor, Tensor]:
        """The logits (N, count, V) at the last `count` tokens of each NO_TOKEN-padded row, its real tokens moved
        to positions 0, 1, ... (the crop; what follows them, causal attention never sees), and the head's input
        there (N, count, C)."""
        N, L = rows.shape
        pads = (rows == NO_TOKEN).sum(1, keepdim=True)  # (N, 1)
        index = torch.arange(L, device=rows.device) + pads
        aligned = rows.gather(1, index.clamp(max=L - 1)).masked_fill(index >= L, 0)
        length = L - int(pads.min())  # the longest row's real tokens
        x = self.hidden(aligned[:, :length])
        last = (L - pads) - count + torch.arange(count, device=rows.device)  # (N, count)
        x = self.ln_f(x.gather(1, last.unsqueeze(-1).expand(-1, -1, x.shape[-1])))
        return self.head(x), x

    def hidden(self, tokens: Tensor) -> Tensor:
        """The last block's output (N, T, C) of a sequence whose first token sits at position 0."""
        T = tokens.shape[1]
        if self.wpe is None:
            x, bias = self.wte(tokens), alibi_bias(self.heads, T, tokens.device)
        else:
            x, bias = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device)), None
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, bias)
        return x
