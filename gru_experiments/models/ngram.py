"""The count-based n-gram language model (the ladder's first rungs, the study's bigram baseline): an order-N model
predicts a token from the N − 1 before it, interpolated modified Kneser-Ney or add-one smoothed, log-probabilities in
float64. docs/internals.md, *The n-gram model*.
"""

import torch
from torch import Tensor

from gru_experiments.errors import UserError
from gru_experiments.models.protocol import ContextWindow, FiniteContextLM
from gru_experiments.validation import check_ints, check_setting

SMOOTHINGS = ("kneser_ney", "add_one")
MIN_DISCOUNT = 0.05
ROWS_PER_CHUNK = 1 << 15  # positions whose distributions are built at once (memory: rows x V float64)
CHUNK_TOKENS = 1 << 24  # fit_in_chunks: training tokens counted at once
PAIR_TABLE_LIMIT = 1 << 26  # fit_in_chunks: the most V x V pair counters it keeps (512 MB)


class NGramLM(FiniteContextLM):
    family = "ngram"
    trainable = False

    def __init__(self, vocab_size: int, order: int = 6, smoothing: str = "kneser_ney"):
        super().__init__()
        check_ints(order=order)
        check_setting(smoothing in SMOOTHINGS, "smoothing", smoothing, " or ".join(repr(s) for s in SMOOTHINGS))
        self._vocab_size = int(vocab_size)
        self.order = order
        self.smoothing = smoothing
        self.window = ContextWindow(order - 1)
        for k in range(1, order + 1):
            self.register_buffer(f"keys_{k}", torch.empty(0, dtype=torch.long))
            self.register_buffer(f"counts_{k}", torch.empty(0, dtype=torch.long))
        self._tables = None  # derived from the counts on first use (see _prepare)

    # --- the protocol ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def forward(self, tokens: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens (B, T) -> log-probabilities (B, T, V) in float64, the last N − 1 tokens."""
        history, new_state = self.window.extend(tokens, state)
        B, T = tokens.shape
        contexts = self._context_ids(history)  # per order k = 2..N: (B, T) ids of the k − 1 tokens before
        flat = [ids.reshape(-1) for ids in contexts]
        rows = [self._distributions([ids[start:start + ROWS_PER_CHUNK] for ids in flat],
                                    min(ROWS_PER_CHUNK, B * T - start))
                for start in range(0, B * T, ROWS_PER_CHUNK)]
        probs = torch.cat(rows) if rows else torch.empty(0, self.vocab_size, dtype=torch.float64,
                                                           device=tokens.device)
        return probs.log().view(B, T, self.vocab_size), new_state

    def stored_numbers(self) -> int:
        return sum(self.keys(k).numel() for k in range(1, self.order + 1))

    # --- counting ---------------------------------------------------------------------------
    def keys(self, k: int) -> Tensor:
        return getattr(self, f"keys_{k}")

    def counts(self, k: int) -> Tensor:
        return getattr(self, f"counts_{k}")

    @torch.no_grad()
    def fit(self, train_ids: Tensor) -> "NGramLM":
        """Count every k-gram (k = 1..N) of `train_ids`: one torch.unique per order."""
        ids = train_ids.reshape(-1).to(self.keys_1.device, torch.long)
        if ids.numel() < self.order:
            raise UserError(f"the training split has {ids.numel()} tokens, fewer than one {self.order}-gram; "
                            "use a longer corpus or a lower model.architecture.order")
        V = self.vocab_size
        previous = None  # ids of the (k−1)-grams ending at positions k−2 .. T−1
        positions = []
        for k in range(1, self.order + 1):
            key = ids if k == 1 else previous[:-1] * V + ids[k - 1:]
            keys, inverse = torch.unique(key, sorted=True, return_inverse=True)
            setattr(self, f"keys_{k}", keys)
            setattr(self, f"counts_{k}", torch.bincount(inverse, minlength=keys.numel()))
            positions.append(inverse)
            previous = inverse
        if self.smoothing == "kneser_ney":
            # Below order N: continuation counts, the number of distinct tokens seen before each
            # k-gram = the number of distinct (k+1)-grams whose last k tokens it is.
            for k in range(1, self.order):
                longer, shorter = positions[k], positions[k - 1][1:]  # aligned: both end at t = k .. T−1
                suffix = torch.empty(self.keys(k + 1).numel(), dtype=torch.long, device=ids.device)
                suffix[longer] = shorter
                setattr(self, f"counts_{k}", torch.bincount(suffix, minlength=self.keys(k).numel()))
        self._tables = None
        return self

    @torch.no_grad()
    def fit_in_chunks(self, train_ids: Tensor, chunk: int = CHUNK_TOKENS, release=None) -> "NGramLM":
        """`fit`'s keys and counts of the study's bigram baseline, a chunk at a time (docs/internals.md); other
        models, or pairs past PAIR_TABLE_LIMIT: `fit`. release: called with each slice of `train_ids` once counted."""
        V, n = self.vocab_size, train_ids.numel()
        if self.order != 2 or self.smoothing != "add_one" or V * V > PAIR_TABLE_LIMIT or n < 2:
            return self.fit(train_ids)
        device = self.keys_1.device
        unigrams = torch.zeros(V, dtype=torch.long, device=device)
        pairs = torch.zeros(V * V, dtype=torch.long, device=device)
        for start in range(0, n, chunk):
            piece = train_ids[start:start + chunk + 1]  # one token more: the pair across
            ids = piece.to(device, torch.long)
            unigrams += torch.bincount(ids[:chunk], minlength=V)
            pairs += torch.bincount(ids[:-1] * V + ids[1:], minlength=V * V)
            if release is not None:
                release(piece)
        self.keys_1 = unigrams.nonzero().flatten()
        self.counts_1 = unigrams[self.keys_1]
        rank = torch.cumsum(unigrams > 0, 0) - 1  # a token's index among keys_1 (fit's keys: previous's inverse)
        seen = pairs.nonzero().flatten()
        self.keys_2, order = torch.sort(rank[seen // V] * V + seen % V)
        self.counts_2 = pairs[seen][order]
        self._tables = None
        return self

    # --- probabilities -----------------------------------------------------------------------
    def _prepare(self):
        """Per order: each context's CSR pointers, each k-gram's discounted share (alpha), each context's back-off
        weight (gamma); and the distribution every lookup starts from."""
        device = self.keys_1.device
        if self._tables is not None and self._tables["device"] == device:
            return self._tables
        if not self.keys_1.numel():  # no counts: a model built but never fitted (nor loaded from a fitted one)
            raise UserError(f"the {self.order}-gram model has counted nothing: fit it on the training split first "
                            "(NGramLM.fit, as train.py does)")
        V = self.vocab_size
        orders = range(1, self.order + 1) if self.smoothing == "kneser_ney" else [self.order]
        per_order = {}
        for k in orders:
            keys, counts = self.keys(k), self.counts(k).double()
            n_contexts = 1 if k == 1 else self.keys(k - 1).numel()
            prefix, token = keys // V, keys % V
            total = torch.bincount(prefix, weights=counts, minlength=n_contexts).double()
            if self.smoothing == "kneser_ney":
                discount = kneser_ney_discounts(counts)[counts.clamp(max=3).long()]
                discount = torch.minimum(discount, counts)  # a count of zero loses nothing
                subtracted = torch.bincount(prefix, weights=discount, minlength=n_contexts).double()
                seen = total > 0
                alpha = (counts - discount) / total[prefix].clamp(min=1e-300)
                gamma = torch.where(seen, subtracted / total.clamp(min=1e-300), torch.ones_like(total))
            else:  # add_one: c/(c_h + V) + V/(c_h + V) · 1/V
                alpha = counts / (total[prefix] + V)
                gamma = V / (total + V)
            pointers = torch.searchsorted(prefix, torch.arange(n_contexts + 1, device=device))
            per_order[k] = (pointers, token, alpha, gamma)
        base = torch.full((V,), 1.0 / V, dtype=torch.float64, device=device)
        if 1 in per_order:  # the unigram level is the same for every position: dense once
            pointers, token, alpha, gamma = per_order.pop(1)
            base = base * gamma[0]
            base.index_add_(0, token, alpha)
        self._tables = {"device": device, "orders": per_order, "base": base}
        return self._tables

    def _context_ids(self, history: Tensor) -> list[Tensor]:
        """Per order k = 2..N, the id of the (k−1)-gram before each next token of `history` (−1: never seen)."""
        V = self.vocab_size
        ids = torch.zeros_like(history)  # the root (empty context) everywhere
        contexts = []
        for k in range(1, self.order):  # ids of the k-grams ending at each column
            # Its first k − 1 tokens: the (k − 1)-gram ending a column before (the first column's k-grams stay
            # unseen: no context kept below starts there, each starts at column >= order − k >= 1).
            shifted = torch.full_like(ids, -1)
            shifted[:, 1:] = ids[:, :-1]
            key = shifted * V + history
            keys = self.keys(k)
            valid = (shifted >= 0) & (history >= 0)
            if keys.numel():
                at = torch.searchsorted(keys, key.clamp(min=0)).clamp(max=keys.numel() - 1)
                found = valid & (keys[at] == key)
                ids = torch.where(found, at, torch.full_like(at, -1))
            else:
                ids = torch.full_like(history, -1)
            contexts.append(ids[:, self.order - 1:])
        return contexts

    def _distributions(self, contexts: list[Tensor], M: int) -> Tensor:
        """(M, V) float64 probabilities for M positions, given their context ids per order."""
        tables = self._prepare()
        probs = tables["base"].expand(M, -1).clone()
        for k, ids in zip(range(2, self.order + 1), contexts):
            if k not in tables["orders"]:
                continue
            pointers, token, alpha, gamma = tables["orders"][k]
            valid = ids >= 0
            safe = ids.clamp(min=0)
            probs *= torch.where(valid, gamma[safe], torch.ones_like(gamma[safe])).unsqueeze(1)
            start = pointers[safe]
            lengths = torch.where(valid, pointers[safe + 1] - start, torch.zeros_like(start))
            rows = torch.repeat_interleave(torch.arange(M, device=ids.device), lengths)
            offsets = torch.cumsum(lengths, 0) - lengths
            entries = start[rows] + torch.arange(rows.numel(), device=ids.device) - offsets[rows]
            probs[rows, token[entries]] += alpha[entries]
        return probs

    # --- checkpoints: the count tables have a size of their own -----------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for k in range(1, self.order + 1):
            for name in (f"keys_{k}", f"counts_{k}"):
                if prefix + name in state_dict:
                    self._buffers[name] = state_dict[prefix + name].to(self._buffers[name].device, torch.long)
        self._tables = None
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, *args, **kwargs):
        self._tables = None
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, order={self.order}, smoothing={self.smoothing!r}"


def kneser_ney_discounts(counts: Tensor) -> Tensor:
    """[0, D(1), D(2), D(3+)] from one order's counts (Chen & Goodman), each clipped to [MIN_DISCOUNT, r]."""
    n = [float((counts == r).sum()) for r in range(1, 5)]
    y = n[0] / (n[0] + 2 * n[1]) if n[0] + 2 * n[1] > 0 else 0.5
    discounts = [0.0]
    for r in (1, 2, 3):
        d = r - (r + 1) * y * n[r] / n[r - 1] if n[r - 1] > 0 else r / 2
        discounts.append(min(max(d, MIN_DISCOUNT), float(r)))
    return torch.tensor(discounts, dtype=torch.float64, device=counts.device)
