"""The model protocol every family implements (`LanguageModel`: what a family defines, what the rest of the code
derives from it, its optional members), the helpers over a state's nesting, and how a config's
`architecture._target_` builds a model: docs/internals.md, *The model protocol*. Nothing outside models/ asks which
family or class a model is.
"""

import importlib
import inspect

import torch
from torch import Tensor, nn

from gru_experiments.errors import UserError
from gru_experiments.validation import InvalidSetting, check_rules

NO_TOKEN = -1  # a context position before the first token
WINDOW_BATCH_TOKENS = 1 << 16  # windows run through a model in batches of about this many tokens (memory only)
DEFAULT_TARGET = "gru_experiments.models.recurrent.RecurrentLM"
PACKAGE = "gru_experiments."  # checkpoints may only name classes in this package
PREFIX = "model.architecture."  # where a model's settings sit in the config


class LanguageModel(nn.Module):
    """Base class of every family; see the module docstring for the protocol."""

    family: str = "model"
    trainable: bool = True

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def context(self) -> int | None:
        """Tokens of context the model can see; None: unbounded."""
        return None

    def forward_cost(self, seen: int, new: int) -> int:
        """Forward tokens one row of `model(tokens, state)` runs for `new` tokens after `seen` (the evaluation's
        plan counts its cost with it)."""
        return new

    @property
    def tokens_per_prediction(self) -> int:
        """Forward tokens a stateful step runs per prediction, once the state has seen all it can."""
        return self.forward_cost(self.context or 1, 1)

    def initial_state(self, batch_size: int, device=None):
        raise NotImplementedError

    def forward(self, tokens: Tensor, state=None):
        """tokens (B, T) -> logits (B, T, V), the state after them: by default `forward_features` without its
        features. A family implements this or `forward_features`."""
        logits, state, _ = self.forward_features(tokens, state)
        return logits, state

    def forward_features(self, tokens: Tensor, state=None) -> tuple[Tensor, object, Tensor | None]:
        """`forward` and the final hidden states its head reads, (B, T, C); None by default (the n-gram's: the
        cache then counts tokens)."""
        if type(self).forward is LanguageModel.forward:
            raise NotImplementedError(f"{type(self).__name__} implements neither forward nor forward_features")
        logits, state = self(tokens, state)
        return logits, state, None

    # --- derived from the members above; a family overrides them only to say otherwise or to run faster ---
    @property
    def recurrent(self) -> bool:
        """Whether the model carries a state from step to step: by default, when its context is unbounded."""
        return self.context is None

    def state_units(self, state) -> list[Tensor]:
        """The units of `state` the run's page shows: one (B, units) tensor per layer (by default each entry, or
        its tuple's first: an LSTM's h); [] for a model that is not `recurrent`."""
        if not self.recurrent or state is None:
            return []
        return [entry if isinstance(entry, Tensor) else entry[0]
                for entry in ([state] if isinstance(state, Tensor) else state)]

    def unit_states(self, tokens: Tensor, state=None) -> tuple[Tensor, object, list[Tensor]]:
        """`forward`, and `state_units` after every token, (B, T, units) per layer: by default one token at a
        time (`LayeredLM` runs the sequence at once)."""
        if not self.recurrent:
            logits, state = self(tokens, state)
            return logits, state, []
        logits, units = [], []
        for t in range(tokens.shape[1]):
            step, state = self(tokens[:, t:t + 1], state)
            logits.append(step)
            units.append(self.state_units(state))
        return torch.cat(logits, 1), state, [torch.stack(layer, 1) for layer in zip(*units)]

    # --- optional: reduced-precision matmuls (trainer.low_precision_matmuls, models/precision.py) ---
    def set_matmul_precision(self, precision) -> None:
        """Which matmuls run their inputs in bf16 (a precision.MatmulPrecision); by default none: ignored."""

    def low_precision_weights(self) -> list[str]:
        """The names of the weights whose matmuls run in bf16 after set_matmul_precision; by default none."""
        return []

    # The modules that carry the sequence: the recurrent layers (and minGRU/minLSTM's norms between them), a
    # transformer's blocks, the MLP's hidden layer (study/dynamic.py adapts them alone with params=recurrence).
    RECURRENCE = ("layers", "norms", "blocks", "hidden")

    def dynamic_parts(self) -> dict[str, list[str]]:
        """The trainable weights' names dynamic evaluation may adapt, by part: `all`, `head` (the output layer's
        `self.head`'s; a head tied to the embedding: that shared matrix) and `recurrence` (the RECURRENCE modules')."""
        names = [name for name, p in self.named_parameters() if p.is_floating_point()]
        head = getattr(self, "head", None)
        head = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
        weights = dict(self.named_parameters())
        return {"all": names,
                "head": [n for n in names if id(weights[n]) in head],
                "recurrence": [n for n in names if n.split(".", 1)[0] in self.RECURRENCE]}

    def fit(self, train_ids: Tensor) -> "LanguageModel":
        """Count the weights from the training split (models with trainable = False)."""
        raise TypeError(f"{type(self).__name__} is trained with an optimizer, not counted")

    @property
    def device(self) -> torch.device:
        for tensor in (*self.parameters(), *self.buffers()):
            return tensor.device
        return torch.device("cpu")


# --- a state's nesting: a tensor, or lists and tuples of them (per layer; an LSTM's (h, c)) ----------------
def map_state(fn, state):
    """`fn` applied to every tensor of a model state (nested lists and tuples of tensors)."""
    if isinstance(state, (list, tuple)):
        return type(state)(map_state(fn, item) for item in state)
    return fn(state) if isinstance(state, Tensor) else state


def copy_state(target, source) -> None:
    """Every tensor of `source` copied into its place in `target` (the same nesting)."""
    if isinstance(target, Tensor):
        target.copy_(source)
    elif isinstance(target, (list, tuple)):
        for t, s in zip(target, source, strict=True):
            copy_state(t, s)


def state_key(state):
    """A state's shape, as hashable (a CUDA graph replays only inputs of its own shapes)."""
    if isinstance(state, (list, tuple)):
        return tuple(state_key(item) for item in state)
    return tuple(state.shape) if isinstance(state, Tensor) else state


class ContextWindow:
    """The state of a model that sees the last `size` tokens: (B, size) token ids, NO_TOKEN-padded on the left."""

    def __init__(self, size: int):
        self.size = size

    def initial(self, batch_size: int, device=None) -> Tensor:
        return torch.full((batch_size, self.size), NO_TOKEN, dtype=torch.long, device=device)

    def extend(self, tokens: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """(the state followed by tokens: (B, size + T), the state after tokens: (B, size))."""
        if state is None:
            state = self.initial(tokens.shape[0], tokens.device)
        history = torch.cat([state.to(tokens.device, torch.long), tokens], dim=1)
        return history, history[:, history.shape[1] - self.size:]


class FiniteContextLM(LanguageModel):
    """A family that sees its last `context` tokens: its state a ContextWindow (the subclass's `self.window`)."""

    window: ContextWindow

    @property
    def context(self) -> int:
        return self.window.size

    def initial_state(self, batch_size: int, device=None) -> Tensor:
        return self.window.initial(batch_size, device)


class LayeredLM(LanguageModel):
    """A family of recurrent `layers` over an `embedding`, each layer returning (every step's state, its final
    state), named by its `cell` (RecurrentLM, MinRNNLM): their state is one entry per layer."""

    cell: str
    embedding: nn.Embedding
    layers: nn.ModuleList

    @property
    def family(self) -> str:
        return self.cell

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def unit_states(self, tokens: Tensor, state: list | None = None) -> tuple[Tensor, list, list[Tensor]]:
        """The protocol's, the sequence at once: each layer's output, captured, is its h at every step."""
        captured: list[Tensor] = []
        hooks = [layer.register_forward_hook(lambda _m, _i, out: captured.append(out[0])) for layer in self.layers]
        try:
            logits, state = self(tokens, state)
        finally:
            for hook in hooks:
                hook.remove()
        return logits, state, captured

    def initial_state(self, batch_size: int, device=None) -> list:
        return [layer.initial_state(batch_size, device) for layer in self.layers]


# --- building a family from its config or checkpoint -------------------------------------
def model_class(target: str, *, from_checkpoint: bool = False) -> type[LanguageModel]:
    """The LanguageModel class `target` names; a checkpoint's only inside this package (an import runs code)."""
    if not isinstance(target, str) or "." not in target:
        raise UserError(f"invalid model.architecture._target_={target!r}: must name a class, e.g. {DEFAULT_TARGET}")
    if from_checkpoint and not target.startswith(PACKAGE):
        raise UserError(f"refusing to build {target!r} from a checkpoint: only classes in {PACKAGE[:-1]} are built")
    module_name, _, class_name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise UserError(f"invalid model.architecture._target_={target!r}: no such class") from None
    if not (inspect.isclass(cls) and issubclass(cls, LanguageModel)):
        raise UserError(f"invalid model.architecture._target_={target!r}: not a LanguageModel "
                        "(gru_experiments/models/protocol.py)")
    return cls


def build_model(architecture, vocab_size: int, *, from_checkpoint: bool = False) -> LanguageModel:
    """The model `architecture` names, its keys checked against the class's settings (each value by the class)."""
    settings = dict(architecture)
    cls = model_class(settings.pop("_target_", None), from_checkpoint=from_checkpoint)
    known = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "vocab_size")]
    family = f" ({cls.family})" if isinstance(cls.family, str) else ""  # a property (minGRU's) is per instance
    check_rules(settings, [], PREFIX, known=known, owner=cls.__name__ + family)
    try:
        return cls(vocab_size=vocab_size, **settings)
    except InvalidSetting as error:
        raise InvalidSetting(error.key, error.value, error.allowed, PREFIX) from None


def meta_model(architecture) -> LanguageModel:
    """The model an architecture names, built on the meta device: what it is, not to run."""
    with torch.device("meta"):
        return build_model(architecture, vocab_size=2)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters; for a counted model (e.g. the n-gram) the numbers it stores."""
    if hasattr(model, "stored_numbers"):
        return int(model.stored_numbers())
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
