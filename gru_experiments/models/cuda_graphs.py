"""CUDA graphs: a model's fixed-shape work recorded once and replayed as one launch (GraphedTrainingStep: a
training step's forward, loss and backward; graphed(model): the inference forwards). Why, what each captures,
and why no figure changes: docs/performance.md, *CUDA graphs*. On a CPU neither runs.
"""

import itertools
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from gru_experiments.models.protocol import copy_state, map_state, state_key

WARMUP_STEPS = 3  # eager steps before a capture: lazy initialisations (cuBLAS handles, autograd) happen there
INFERENCE_GRAPHS = 8  # input shapes graphed per model; later shapes run eagerly (the context curve's many)

_enabled = ContextVar("cuda_graphs", default=True)


@contextmanager
def cuda_graphs(enabled: bool):
    """The training step and inference forwards replayed from graphs (on CUDA) inside this block or not: a run's
    `cuda_graphs`, set once around its training and evaluation (runs/training.py)."""
    token = _enabled.set(bool(enabled))
    try:
        yield
    finally:
        _enabled.reset(token)


def enabled() -> bool:
    """Whether the enclosing `cuda_graphs` block (if any) asks for graphs: they are on unless it says false."""
    return _enabled.get()


def release_generators() -> None:
    """After a capture that broke off, the CUDA generators still believe they are capturing (torch ends their
    capture only in a capture that ends well), and the next eager dropout fails with "Offset increment outside
    graph capture". A copy of each generator's state (same seed and offset, not capturing) takes its place."""
    for generator in torch.cuda.default_generators:
        if hasattr(generator, "graphsafe_set_state"):
            generator.graphsafe_set_state(generator.clone_state())


def failure(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


class _Captured:
    """One graph and its static inputs and outputs."""

    def __init__(self, graph, inputs: tuple, outputs: tuple):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.grads: list = []  # a training step's: the gradient tensors its replays write

    def replay(self, *inputs) -> tuple:
        for static, value in zip(self.inputs, inputs):
            copy_state(static, value)
        self.graph.replay()
        return self.outputs


def capture(fn: Callable, *inputs) -> _Captured:
    """fn(*static inputs) recorded in a CUDA graph (and not run: replay runs it). Raises where it cannot be."""
    static = map_state(torch.Tensor.clone, inputs)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outputs = fn(*static)
    except Exception:
        release_generators()
        raise
    return _Captured(graph, static, outputs)


class GraphedTrainingStep:
    """`step(inputs, targets, state=None)` -> (loss, final state), both detached, with every parameter's .grad
    holding this step's gradient (written, not accumulated). `loss_fn(inputs, targets, state)` -> (loss, final
    state). The first `warmup` steps run eagerly on a side stream; then each kind of step (from the zero state,
    or from a carried one) is captured once and replayed. A capture that fails says so in one line and leaves
    every step eager."""

    def __init__(self, loss_fn: Callable, parameters, warmup: int = WARMUP_STEPS,
                 say: Callable[[str], None] = print):
        self.loss_fn, self.parameters, self.warmup, self.say = loss_fn, list(parameters), warmup, say
        self.steps = 0
        self.graphs: dict = {}  # (inputs' shape, the state's) -> _Captured
        self.failed: str | None = None  # why a capture failed: every step stays eager

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    @staticmethod
    def capturable(inputs: Tensor) -> bool:
        """Where a graph can be captured: on CUDA (tests stand a CPU emulation of capture and replay in)."""
        return inputs.is_cuda

    def __call__(self, inputs: Tensor, targets: Tensor, state=None):
        self.steps += 1
        key = (tuple(inputs.shape), state_key(state))
        if key in self.graphs:
            return self._replay(key, inputs, targets, state)
        if self.failed is None and self.steps > self.warmup and self.capturable(inputs):
            self._clear_grads()  # the capture's backward then writes fresh gradient tensors, which replays rewrite
            try:
                captured = capture(self._forward_backward, inputs, targets, state)
                # The gradient tensors this graph writes at every replay (each graph its own, in its memory pool).
                captured.grads = [p.grad for p in self.parameters]
                self.graphs[key] = captured
            except Exception as err:  # noqa: BLE001 - any failure to capture means: train eagerly
                self.failed = failure(err)
                self.say(f"cuda_graphs: the training step could not be captured ({self.failed}); training "
                         "eagerly")
            else:
                if len(self.graphs) == 1:
                    self.say(f"cuda_graphs: the training step is captured at step {self.steps} and replayed "
                             "from then on")
                return self._replay(key, inputs, targets, state)
        return self._eager(inputs, targets, state)

    def _replay(self, key, inputs, targets, state):
        captured = self.graphs[key]
        loss, final = captured.replay(inputs, targets, state)
        # .grad set again at every replay: Lightning sets it to None before each validation (to free memory), and
        # another graph (a carried state's) writes gradients of its own elsewhere.
        for p, grad in zip(self.parameters, captured.grads):
            p.grad = grad
        # The next replay overwrites them; what the caller keeps (a logged loss, a carried state) must stay.
        return loss.clone(), map_state(torch.Tensor.clone, final)

    def _forward_backward(self, inputs, targets, state):
        loss, final = self.loss_fn(inputs, targets, state)
        loss.backward()
        return loss.detach(), map_state(torch.Tensor.detach, final)

    def _eager(self, inputs: Tensor, targets: Tensor, state):
        self._clear_grads()
        if not inputs.is_cuda:
            return self._forward_backward(inputs, targets, state)
        # On a side stream, as CUDA graphs want their warmup: nothing it caches belongs to the capture stream.
        side = torch.cuda.Stream(inputs.device)
        side.wait_stream(torch.cuda.current_stream(inputs.device))
        with torch.cuda.stream(side):
            result = self._forward_backward(inputs, targets, state)
        torch.cuda.current_stream(inputs.device).wait_stream(side)
        return result

    def _clear_grads(self) -> None:
        for p in self.parameters:
            p.grad = None


class GraphedForward:
    """model(tokens, state) and model.forward_features(tokens, state) without grad, on CUDA, replayed from a graph
    for every input shape seen twice (the first time runs eagerly: a shape used once is not worth a capture); at
    most INFERENCE_GRAPHS shapes, one set per train/eval mode. Outputs are fresh tensors, as the eager call's."""

    def __init__(self, model: nn.Module):
        # weakly: _forwards' value must not keep its key alive (a best checkpoint's model, its graphs' memory)
        self._model = weakref.ref(model)
        self.graphs: dict = {}
        self.seen: set = set()
        self.weights: tuple = ()  # every parameter's and buffer's address: the memory the graphs read
        self.failed: str | None = None

    @property
    def model(self) -> nn.Module:
        return self._model()

    @staticmethod
    def capturable(tokens: Tensor) -> bool:
        """Where a graph can be captured: on CUDA (tests stand a CPU emulation of capture and replay in)."""
        return tokens.is_cuda

    def __call__(self, tokens: Tensor, state=None):
        return self._replayed(None, tokens, state)

    def forward_features(self, tokens: Tensor, state=None):
        """The model's forward_features (the logits, the state and the final hidden states), replayed alike."""
        return self._replayed("forward_features", tokens, state)

    def _replayed(self, member: str | None, tokens: Tensor, state):
        model = self.model
        forward = model if member is None else getattr(model, member)
        if (not (self.capturable(tokens) and _enabled.get()) or torch.is_grad_enabled()
                or torch.is_inference_mode_enabled() or self.failed is not None):
            return forward(tokens, state)
        key = (member, tuple(tokens.shape), tokens.dtype, state_key(state), model.training,
               id(getattr(model, "matmul_precision", None)))
        if key not in self.graphs:
            if key not in self.seen or len(self.graphs) >= INFERENCE_GRAPHS:
                self.seen.add(key)
                return forward(tokens, state)
            try:
                self.graphs[key] = capture(forward, tokens, state)
            except Exception as err:  # noqa: BLE001 - any failure to capture means: eager from now on
                self.failed = failure(err)
                print(f"cuda_graphs: the model's forward could not be captured ({self.failed}); evaluating eagerly")
                return forward(tokens, state)
        return map_state(torch.Tensor.clone, self.graphs[key].replay(tokens, state))

    def refresh(self) -> "GraphedForward":
        """Forgets the graphs if the weights moved since they were captured (they would read the old, freed
        memory). Once per pass (graphed()), not per call: every address costs tens of µs, the sampler's step a
        few hundred."""
        weights = weight_addresses(self.model)
        if weights != self.weights:
            self.graphs, self.seen, self.weights = {}, set(), weights
        return self


def weight_addresses(model: nn.Module) -> tuple:
    """Every parameter's and buffer's address. All of them, not the first only: after .cpu() and .cuda()
    (Lightning's teardown, then the evaluation) the allocator can put the first back where it was and the
    others elsewhere, and a replay then reads freed memory (the first Scribe-γ run on an H200 crashed so)."""
    return tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))


_forwards: "weakref.WeakKeyDictionary[nn.Module, GraphedForward]" = weakref.WeakKeyDictionary()


def graphed(model: nn.Module) -> Callable:
    """The model's inference forward (and its forward_features), replayed from CUDA graphs where that applies
    (GraphedForward); the model itself where it cannot (on a CPU, or with cuda_graphs off): call it as the model.
    Take it once per pass (a loop over a split, a generation), after any move of the model."""
    if not _enabled.get() or not GraphedForward.capturable(next(model.parameters(), torch.empty(0))):
        return model
    if model not in _forwards:
        _forwards[model] = GraphedForward(model)
    return _forwards[model].refresh()
