"""What the fast GRU, LSTM and RNN paths share: matmul dtypes, the input projection of all steps at
once, its gradients, and the packed-weight step matmul (see __init__.py and docs/performance.md)."""

import torch
from torch import Tensor

from gru_experiments.models.precision import MatmulPrecision, autocast_precision


def needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def matmul_dtypes(precision: MatmulPrecision | None, x: Tensor, *weights: Tensor) -> tuple:
    """Per weight: the dtype its matmuls take their inputs in (None: x's); `precision` None: autocast's, if on."""
    precision = precision or autocast_precision(x.device.type)
    if precision is None:
        return (None,) * len(weights)
    dtypes = (precision.for_weight(w) for w in weights)
    return tuple(None if d == x.dtype else d for d in dtypes)


def mm_t(a: Tensor, b: Tensor, a_low: Tensor | None, dtype: torch.dtype | None) -> Tensor:
    """aᵀ·b (a weight gradient over all T·B rows), in `dtype` if given (a_low: a, cast), in a's dtype."""
    if dtype is None:
        return a.t().mm(b)
    return a_low.t().mm(b.to(dtype)).to(a.dtype)


def time_major(x: Tensor) -> Tensor:
    """(B, T, I) -> (T·B, I), rows step-major. Copies x only if it is not time-major in
    memory already; a previous fast layer's output (through dropout) is."""
    B, T, I = x.shape
    return x.transpose(0, 1).reshape(T * B, I)


def input_side_grads(dA: Tensor, dA_low: Tensor | None, X: Tensor, W_x: Tensor, x_shape, needs_x: bool,
                      needs_W: bool, needs_b: bool):
    """Gradients of the input projection A = X·W_xᵀ + b, each one matmul (or sum) over all T·B rows, from X
    and W_x as the forward used them (dA_low: dA in bf16 on the bf16 path); in dA's dtype."""
    flat = dA.view(X.shape[0], -1)
    low = X.dtype != flat.dtype
    grad_x = grad_W = grad_b = None
    if needs_x:
        B, T, I = x_shape
        grad_x = (dA_low.mm(W_x).to(flat.dtype) if low else flat.mm(W_x)).view(T, B, I).transpose(0, 1)
    if needs_W:
        grad_W = mm_t(flat, X, dA_low, X.dtype if low else None)
    if needs_b:
        grad_b = flat.sum(0)
    return grad_x, grad_W, grad_b


def input_projection(X: Tensor, W_x: Tensor, bias: Tensor, dtype: torch.dtype | None, out: Tensor | None = None):
    """A = X·W_xᵀ + bias for all T·B rows in one matmul (into `out` if given); on the bf16 path X and W_x are
    cast once (returned, for backward) and the bias is added in the computation's dtype."""
    if dtype is None:
        return torch.addmm(bias, X, W_x.t(), out=out), X, W_x
    X, W_x = X.to(dtype), W_x.to(dtype)
    return torch.add(torch.mm(X, W_x.t()), bias, out=out), X, W_x


# MKL's packed GEMM (a private op of x86 CPU builds): the weight reordered once, not re-packed by every step's mm;
# worth it only for a big weight over enough steps to repay the reorder (benchmarks/RESULTS.md).
PACKED_MIN_WEIGHT_ELEMENTS = 400_000  # ~1.6 MB of fp32: the GRU's H×2H from H=448, an LSTM's H×4H from H=320
PACKED_MIN_STEPS = 16
HAS_MKL_PACKED = hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and torch.backends.mkl.is_available()


class StepMatmul:
    """`x @ M` for many x of one shape (B, K), M (K, N) fixed across the T steps."""

    def __init__(self, M: Tensor, batch: int, steps: int, low_dtype: torch.dtype | None = None):
        self.batch = batch
        self.packed = None
        self.scratch = None
        if low_dtype is not None and low_dtype != M.dtype:
            # bf16: the weight cast once per sequence; each step's x is cast into one scratch row.
            self.M = M.to(low_dtype).contiguous()
            self.scratch = M.new_empty((batch, M.shape[0]), dtype=low_dtype)
            return
        if (HAS_MKL_PACKED and M.device.type == "cpu" and M.dtype == torch.float32
                and steps >= PACKED_MIN_STEPS and M.numel() >= PACKED_MIN_WEIGHT_ELEMENTS):
            try:
                self.linear_weight = M.t().contiguous()  # nn.Linear layout (N, K)
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.linear_weight, batch)
            except RuntimeError:  # a build without it after all: plain matmuls
                self.packed = None
        if self.packed is None:
            # A contiguous (K, N) copy when there are several steps: for the small
            # per-step products, MKL runs ~25% faster with it than with a transposed view.
            self.M = M.contiguous() if steps > 1 else M

    @property
    def input_dtype(self) -> torch.dtype:
        return self.M.dtype if self.packed is None else self.linear_weight.dtype

    def mm(self, x: Tensor) -> Tensor:
        """x @ M, in M's dtype (bf16 on the bf16 path: the kernel accumulates in fp32)."""
        if self.packed is None:
            if x.dtype != self.M.dtype:
                x = self.scratch.copy_(x) if self.scratch is not None and x.shape == self.scratch.shape \
                    else x.to(self.M.dtype)
            return torch.mm(x, self.M)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.linear_weight, None, self.batch)

    def addmm(self, acc: Tensor, x: Tensor) -> Tensor:
        """acc + x @ M, a new tensor in acc's dtype."""
        if self.packed is None and self.M.dtype == acc.dtype:
            return torch.addmm(acc, x, self.M)
        y = self.mm(x)
        return y.add_(acc) if y.dtype == acc.dtype else torch.add(acc, y)

    def addmm_(self, acc: Tensor, x: Tensor) -> Tensor:
        """acc += x @ M, in place."""
        if self.packed is None and self.M.dtype == acc.dtype:
            return acc.addmm_(x, self.M)
        return acc.add_(self.mm(x))


# Fused pointwise derivatives (one pass each, no temporaries):
#   sigmoid_backward(g, y) = g ⊙ y ⊙ (1 − y)     tanh_backward(g, y) = g ⊙ (1 − y²)
sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
tanh_backward = torch.ops.aten.tanh_backward.grad_input


def run_h_only(function, one_step, inputs, precision: MatmulPrecision | None, weights):
    """A layer whose state is its output (GRU, RNN) over x = inputs[0]: one step without grad by `one_step` (stateful
    sampling: the sequence machinery would cost more than the arithmetic), else its autograd Function (without grad
    too: it then records nothing). `weights`: those whose matmuls `precision` may run in bf16."""
    x = inputs[0]
    if x.shape[1] == 1 and not needs_grad(*inputs):
        h = one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), h
    inputs = tuple(t.to(x.dtype) for t in inputs)  # cast outside the Function: autograd casts the grads back
    outputs = function.apply(*inputs, matmul_dtypes(precision, x, *weights))
    # outputs is time-major; the batch-first view costs nothing. The final state is
    # the last output (a view: its gradient flows into the outputs' gradient).
    return outputs.transpose(0, 1), outputs[-1]


def step_slice(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    return None if t is None else t[:, start:stop]
