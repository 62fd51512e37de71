"""Fast paths for the layers in `cells.py`: the same formulas, fewer and bigger ops.

`gru_sequence` and `lstm_sequence` run one layer over a whole sequence. With grad, each is
one custom `torch.autograd.Function`: the forward does the input side of all T steps as
one matmul and loops only over the hidden side, keeping every step's gates in one buffer;
the backward walks the hidden-state recurrence backwards and gets every weight gradient as
one matmul over all steps. Without grad the same forward runs bare, and a single step
(stateful sampling) takes a shortcut with the fewest ops.

Optionally (`precision`, a `MatmulPrecision`, or autocast) the matmuls take bf16 inputs,
with the weights cast once per sequence; the hidden state, the gate pre-activations and
the pointwise math stay in the computation's dtype (float32).

The derivation of the backward equations, the design and the measurements behind it:
docs/performance.md. tests/test_fast_recurrence.py holds this to the readable reference
(`cells.py`, `step`) within 1e-5 in float32, and the bf16 path within a stated tolerance.
Double backward is not supported (`once_differentiable`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gru_experiments.precision import MatmulPrecision, autocast_precision


# ------------------------------------------------------------------------------- helpers
def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _matmul_dtypes(precision: MatmulPrecision | None, x: Tensor, *weights: Tensor) -> tuple:
    """Per weight: the dtype its matmuls take their inputs in, or None for the computation's
    own dtype (x's). `precision` None: autocast's when it is on, else none."""
    precision = precision or autocast_precision(x.device.type)
    if precision is None:
        return (None,) * len(weights)
    dtypes = (precision.for_weight(w) for w in weights)
    return tuple(None if d == x.dtype else d for d in dtypes)


def _mm_t(a: Tensor, b: Tensor, a_low: Tensor | None, dtype: torch.dtype | None) -> Tensor:
    """aᵀ·b (a weight gradient over all T·B rows), in `dtype` if given (a_low: a, already
    cast), returned in a's dtype."""
    if dtype is None:
        return a.t().mm(b)
    return a_low.t().mm(b.to(dtype)).to(a.dtype)


def _time_major(x: Tensor) -> Tensor:
    """(B, T, I) -> (T·B, I), rows step-major. Copies x only if it is not time-major in
    memory already; a previous fast layer's output (through dropout) is."""
    B, T, I = x.shape
    return x.transpose(0, 1).reshape(T * B, I)


def _input_side_grads(dA: Tensor, dA_low: Tensor | None, X: Tensor, W_x: Tensor, x_shape, needs_x: bool,
                      needs_W: bool, needs_b: bool):
    """Gradients of the input projection A = X·W_xᵀ + b: each one matmul (or one sum)
    over all T·B rows at once. X and W_x are as the forward used them (bf16 on the bf16
    path, with dA_low = dA in bf16); the gradients come back in dA's dtype."""
    flat = dA.view(X.shape[0], -1)
    low = X.dtype != flat.dtype
    grad_x = grad_W = grad_b = None
    if needs_x:
        B, T, I = x_shape
        grad_x = (dA_low.mm(W_x).to(flat.dtype) if low else flat.mm(W_x)).view(T, B, I).transpose(0, 1)
    if needs_W:
        grad_W = _mm_t(flat, X, dA_low, X.dtype if low else None)
    if needs_b:
        grad_b = flat.sum(0)
    return grad_x, grad_W, grad_b


def _input_projection(X: Tensor, W_x: Tensor, bias: Tensor, dtype: torch.dtype | None):
    """A = X·W_xᵀ + bias for all T·B rows in one matmul; on the bf16 path X and W_x are cast
    once (returned, for backward) and the bias is added in the computation's dtype."""
    if dtype is None:
        return torch.addmm(bias, X, W_x.t()), X, W_x
    X, W_x = X.to(dtype), W_x.to(dtype)
    return torch.add(torch.mm(X, W_x.t()), bias), X, W_x


# MKL's packed GEMM (a private op of x86 CPU builds, the one inductor uses for frozen
# linears): the weight is reordered once, then reused by every step. An ordinary mm
# re-packs the weight on every call, which costs as much as the multiply itself for a big
# weight and a thin (batch-row) input. Worth it only when the weight is big and there are
# enough steps to repay the reorder (measurements: benchmarks/RESULTS.md).
PACKED_MIN_WEIGHT_ELEMENTS = 400_000  # ~1.6 MB of fp32: the GRU's H×2H from H=448, an LSTM's H×4H from H=320
PACKED_MIN_STEPS = 16
_HAS_MKL_PACKED = hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and torch.backends.mkl.is_available()


class _StepMatmul:
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
        if (_HAS_MKL_PACKED and M.device.type == "cpu" and M.dtype == torch.float32
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
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input


# ----------------------------------------------------------------------------------- GRU
def gru_sequence(x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate,
                 precision: MatmulPrecision | None = None):
    """The study's GRU over x (B, T, I) from state h (B, H): outputs (B, T, H), final h.
    `precision`: which matmuls take bf16 inputs (None: autocast's choice, else none)."""
    inputs = (x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h = _gru_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), h
    inputs = tuple(t.to(x.dtype) for t in inputs)  # cast outside the Function: autograd casts the grads back
    dtypes = _matmul_dtypes(precision, x, input_weight, hidden_weight_rz, hidden_weight_candidate)
    if _needs_grad(*inputs):
        outputs = _GRUFunction.apply(*inputs, dtypes)
    else:
        with torch.autocast(x.device.type, enabled=False):
            outputs = _gru_forward(*inputs, dtypes)[0][1:]
    # outputs is time-major; the batch-first view costs nothing. The final state is
    # the last output (a view: its gradient flows into the outputs' gradient).
    return outputs.transpose(0, 1), outputs[-1]


def _gru_one_step(x, h, W_x, b_x, W_rz, b_rz, W_h):
    """Stateful sampling feeds one token at a time without grad: the same formulas with
    the fewest ops (the sequence machinery would cost more than the arithmetic)."""
    H = W_h.shape[0]
    p = torch.addmm(b_x, x, W_x.t())
    h = h.to(p.dtype)
    rz = torch.addmm(p[:, : 2 * H], h, W_rz.t().to(p.dtype)).add_(b_rz).sigmoid_()
    candidate = torch.addmm(p[:, 2 * H:], rz[:, :H] * h, W_h.t().to(p.dtype)).tanh_()
    return torch.lerp(h, candidate, rz[:, H:])


def _gru_forward(x, h0, W_x, b_x, W_rz, b_rz, W_h, dtypes=(None, None, None)):
    dtype_x, dtype_rz, dtype_h = dtypes
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    bias = b_x.clone()
    bias[: 2 * H] += b_rz  # b_r and b_z join their input-side biases; the candidate has no hidden bias
    # The input side of every step in one matmul: A = [a_r | a_z | a_c] still without
    # the hidden terms. The loop adds those in place and applies the activations, so A
    # ends up holding [r | z | h̃] for every step: what backward needs, in the same
    # buffer (fresh large buffers are not free: first-touch page faults).
    A, X, W_x = _input_projection(X, W_x, bias, dtype_x)
    A = A.view(T, B, 3 * H)
    Hs = A.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    rz_matmul, c_matmul = _StepMatmul(W_rz.t(), B, T, dtype_rz), _StepMatmul(W_h.t(), B, T, dtype_h)
    # r ⊙ h_{t-1}: one scratch row, written straight in the dtype its matmul takes (the
    # cast is free); backward recomputes all q from R and Hs.
    q = A.new_empty(B, H, dtype=c_matmul.input_dtype)
    h = h0
    # unbind once: the per-step views are made in C++ in one go, not by T×5 Python indexings.
    for rz, r, z, c, y in zip(A[..., : 2 * H].unbind(0), A[..., :H].unbind(0), A[..., H: 2 * H].unbind(0),
                              A[..., 2 * H:].unbind(0), Hs[1:].unbind(0)):
        rz_matmul.addmm_(rz, h).sigmoid_()  # r and z: one (H -> 2H) matmul
        torch.mul(r, h, out=q)  # reset applied *before* the candidate matmul (the study's GRU)
        c_matmul.addmm_(c, q).tanh_()
        h = torch.lerp(h, c, z, out=y)  # (1 − z) ⊙ h + z ⊙ h̃ in one op
    return Hs, A, X, W_x


class _GRUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, W_x, b_x, W_rz, b_rz, W_h, dtypes):
        with torch.autocast(x.device.type, enabled=False):  # out=/in-place ops and autocast don't mix
            Hs, A, X, W_x_used = _gru_forward(x, h0, W_x, b_x, W_rz, b_rz, W_h, dtypes)
        ctx.save_for_backward(X, W_x_used, W_rz, W_h, Hs, A)  # X, W_x as multiplied (bf16 on that path)
        ctx.x_shape, ctx.dtypes = x.shape, dtypes
        return Hs[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y):
        X, W_x, W_rz, W_h, Hs, A = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, W_x, b_x, W_rz, b_rz, W_h
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, dA_low, grad_h0, grad_W_rz, grad_W_h = _gru_backward(grad_Y.to(A.dtype), W_rz, W_h, Hs, A, needs,
                                                                     ctx.dtypes)
            grad_x, grad_W_x, grad_bias = _input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[2],
                                                            needs[3] or needs[5])
        H = W_h.shape[0]
        grad_b_x = grad_bias if needs[3] else None
        grad_b_rz = grad_bias[: 2 * H] if needs[5] else None  # b_r, b_z sit in the same sums as b_rx, b_zx
        return grad_x, grad_h0, grad_W_x, grad_b_x, grad_W_rz, grad_b_rz, grad_W_h, None


def _gru_backward(grad_Y, W_rz, W_h, Hs, A, needs, dtypes=(None, None, None)):
    dtype_x, dtype_rz, dtype_h = dtypes
    T, B, H = grad_Y.shape
    H_prev = Hs[:-1]  # h_{t-1} for every t
    R, Z, C = A[..., :H], A[..., H: 2 * H], A[..., 2 * H:]
    # Every factor that does not depend on δ, for all steps at once (module docstring),
    # written into the buffer that becomes dA: step t's loop turns its own K_t into
    # dA_t in place, so one (T, B, 3H) buffer serves both.
    dA = A.new_empty(T, B, 3 * H)
    K_r, K_z, K_c = dA[..., :H], dA[..., H: 2 * H], dA[..., 2 * H:]
    _sigmoid_backward(H_prev, R, grad_input=K_r)  # h r (1 − r)
    torch.sub(C, H_prev, out=K_z)
    _sigmoid_backward(K_z, Z, grad_input=K_z)  # (h̃ − h) z (1 − z)
    _tanh_backward(Z, C, grad_input=K_c)  # z (1 − h̃²)
    one_minus_z = 1 - Z

    # ∂L/∂y_{t-1} for each t (nothing before step 0): the term δ_{t-1} starts from.
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    steps = list(zip(grad_prev, K_r.unbind(0), K_z.unbind(0), K_c.unbind(0), dA[..., : 2 * H].unbind(0),
                     one_minus_z.unbind(0), R.unbind(0)))
    dq_matmul, rz_matmul = _StepMatmul(W_h, B, T, dtype_h), _StepMatmul(W_rz, B, T, dtype_rz)
    delta = grad_Y[-1]
    for g_prev, da_r, da_z, da_c, da_rz, omz, r in reversed(steps):
        da_z.mul_(delta)  # da_z = δ ⊙ K_z
        da_c.mul_(delta)  # da_c = δ ⊙ K_c
        dq = dq_matmul.mm(da_c)  # gradient of q = r ⊙ h
        da_r.mul_(dq)  # da_r = dq ⊙ h ⊙ σ'(a_r)
        new_delta = rz_matmul.addmm(g_prev, da_rz)  # through both gates' hidden matmuls
        new_delta.addcmul_(delta, omz)  # the direct path through the interpolation
        delta = new_delta.addcmul_(dq, r)  # h's own share of r ⊙ h

    flat = dA.view(T * B, 3 * H)
    low = dtype_x or dtype_rz or dtype_h  # one low dtype: dA is cast to it once, for every matmul
    flat_low = flat.to(low) if low else None
    grad_W_rz = grad_W_h = None
    if needs[4]:
        grad_W_rz = _mm_t(flat[:, : 2 * H], H_prev.reshape(T * B, H), _slice(flat_low, 0, 2 * H), dtype_rz)
    if needs[6]:
        # q_t = r_t ⊙ h_{t-1}, into a buffer now free (or straight in bf16)
        Q = torch.mul(R, H_prev, out=one_minus_z if dtype_h is None else None)
        grad_W_h = _mm_t(flat[:, 2 * H:], Q.reshape(T * B, H), _slice(flat_low, 2 * H, 3 * H), dtype_h)
    return dA, flat_low, (delta if needs[1] else None), grad_W_rz, grad_W_h


def _slice(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    return None if t is None else t[:, start:stop]


# ---------------------------------------------------------------------------------- LSTM
def lstm_sequence(x, state, input_weight, input_bias, hidden_weight, precision: MatmulPrecision | None = None):
    """The LSTM over x (B, T, I) from state (h, c): outputs (B, T, H), final (h, c).
    `precision`: as for gru_sequence."""
    h, c = state
    inputs = (x, h, c, input_weight, input_bias, hidden_weight)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h, c = _lstm_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), (h, c)
    inputs = tuple(t.to(x.dtype) for t in inputs)
    dtypes = _matmul_dtypes(precision, x, input_weight, hidden_weight)
    if _needs_grad(*inputs):
        outputs, c_last = _LSTMFunction.apply(*inputs, dtypes)
    else:
        with torch.autocast(x.device.type, enabled=False):
            Hs, Cs, _, _, _ = _lstm_forward(*inputs, dtypes)
        outputs, c_last = Hs[1:], Cs[-1]
    return outputs.transpose(0, 1), (outputs[-1], c_last)


def _lstm_one_step(x, h, c, W_x, b, W):
    """One step without grad, for stateful sampling (see _gru_one_step)."""
    H = h.shape[1]
    p = torch.addmm(b, x, W_x.t())
    gates = torch.addmm(p, h.to(p.dtype), W.t().to(p.dtype))
    gates[:, : 2 * H].sigmoid_()  # i, f
    gates[:, 2 * H: 3 * H].tanh_()  # g
    gates[:, 3 * H:].sigmoid_()  # o
    i, f, g, o = gates.chunk(4, 1)
    c = torch.addcmul(f * c.to(p.dtype), i, g)
    return o * torch.tanh(c), c


def _lstm_forward(x, h0, c0, W_x, b, W, dtypes=(None, None)):
    dtype_x, dtype_W = dtypes
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    # Input side of every step in one matmul; the loop adds W·h in place and activates,
    # so G ends up holding the gates [i | f | g | o] of every step (see _gru_forward).
    G, X, W_x = _input_projection(X, W_x, b, dtype_x)
    G = G.view(T, B, 4 * H)
    Hs = G.new_empty(T + 1, B, H)  # h_0 .. h_T (outputs are Hs[1:])
    Cs = G.new_empty(T + 1, B, H)  # c_0 .. c_T
    Hs[0], Cs[0] = h0, c0
    tc = G.new_empty(B, H)  # tanh(c_t): one scratch row; backward recomputes it from Cs
    matmul = _StepMatmul(W.t(), B, T, dtype_W)
    h, c = h0, c0
    for g, i_f, i, f, g_g, o, c_t, y in zip(
            G.unbind(0), G[..., : 2 * H].unbind(0), G[..., :H].unbind(0), G[..., H: 2 * H].unbind(0),
            G[..., 2 * H: 3 * H].unbind(0), G[..., 3 * H:].unbind(0), Cs[1:].unbind(0), Hs[1:].unbind(0)):
        matmul.addmm_(g, h)  # all four gates' hidden matmuls at once
        i_f.sigmoid_()
        g_g.tanh_()
        o.sigmoid_()
        c = torch.mul(f, c, out=c_t).addcmul_(i, g_g)  # f ⊙ c + i ⊙ g
        h = torch.mul(o, torch.tanh(c, out=tc), out=y)
    return Hs, Cs, G, X, W_x


class _LSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, W_x, b, W, dtypes):
        with torch.autocast(x.device.type, enabled=False):
            Hs, Cs, G, X, W_x_used = _lstm_forward(x, h0, c0, W_x, b, W, dtypes)
        ctx.save_for_backward(X, W_x_used, W, Hs, Cs, G)
        ctx.x_shape, ctx.dtypes = x.shape, dtypes
        # c_T is returned as its own tensor (a clone, not a view of the saved buffer).
        return Hs[1:], Cs[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y, grad_c_last):
        X, W_x, W, Hs, Cs, G = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, c0, W_x, b, W
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, dA_low, grad_h0, grad_c0, grad_W = _lstm_backward(grad_Y.to(G.dtype), grad_c_last.to(G.dtype),
                                                                  W, Hs, Cs, G, needs, ctx.dtypes)
            grad_x, grad_W_x, grad_b = _input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[3],
                                                         needs[4])
        return grad_x, grad_h0, grad_c0, grad_W_x, grad_b, grad_W, None


def _lstm_backward(grad_Y, grad_c_last, W, Hs, Cs, G, needs, dtypes=(None, None)):
    dtype_x, dtype_W = dtypes
    T, B, H = grad_Y.shape
    I, F, Gg, O = G[..., :H], G[..., H: 2 * H], G[..., 2 * H: 3 * H], G[..., 3 * H:]
    # Factors independent of δ and γ, for all steps at once, written into the buffer that
    # becomes dA (laid out like it): step t's loop turns K_t into dA_t in place.
    dA = torch.empty_like(G)
    K_i, K_f, K_g, K_o = dA[..., :H], dA[..., H: 2 * H], dA[..., 2 * H: 3 * H], dA[..., 3 * H:]
    _sigmoid_backward(Gg, I, grad_input=K_i)  # g i (1 − i)
    _sigmoid_backward(Cs[:-1], F, grad_input=K_f)  # c_{t-1} f (1 − f)
    _tanh_backward(I, Gg, grad_input=K_g)  # i (1 − g²)
    K_c = torch.tanh(Cs[1:])  # tanh(c_t) ...
    _sigmoid_backward(K_c, O, grad_input=K_o)  # tanh(c_t) o (1 − o)
    _tanh_backward(O, K_c, grad_input=K_c)  # ... becomes o (1 − tanh² c_t)

    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    steps = list(zip(grad_prev, dA.unbind(0), K_i.unbind(0), K_f.unbind(0), K_g.unbind(0), K_o.unbind(0),
                     K_c.unbind(0), F.unbind(0)))
    matmul = _StepMatmul(W, B, T, dtype_W)
    delta, gamma = grad_Y[-1], grad_c_last
    for g_prev, da, da_i, da_f, da_g, da_o, k_c, f in reversed(steps):
        gamma = torch.addcmul(gamma, delta, k_c)  # ∂L/∂c_t in total
        da_i.mul_(gamma)  # da_i = γ ⊙ K_i (separate multiplies beat one broadcast one here)
        da_f.mul_(gamma)  # da_f = γ ⊙ K_f
        da_g.mul_(gamma)  # da_g = γ ⊙ K_g
        da_o.mul_(delta)  # da_o = δ ⊙ K_o
        gamma.mul_(f)  # γ_{t-1} = γ ⊙ f
        delta = matmul.addmm(g_prev, da)  # δ_{t-1}

    flat = dA.view(T * B, 4 * H)
    low = dtype_x or dtype_W  # dA cast once, for every matmul that takes it in bf16
    flat_low = flat.to(low) if low else None
    grad_W = _mm_t(flat, Hs[:-1].reshape(T * B, H), flat_low, dtype_W) if needs[5] else None
    return dA, flat_low, (delta if needs[1] else None), (gamma if needs[2] else None), grad_W


# ----------------------------------------------------------------------------------- RNN
# Elman: a = P + W_h·h (P = W_x·x + b, all steps in one matmul), h' = tanh(a).
# Backward, with δ = ∂L/∂h_t in total:  da = δ ⊙ (1 − h'²);  δ_{t-1} = da @ W_h + ∂L/∂y_{t-1};
# dW_h = Σ_t daᵀ h_{t-1} (one matmul); dW_x = dAᵀX, dx = dA·W_x, db = Σ dA; dh_0 = δ_0.
def rnn_sequence(x, h, input_weight, input_bias, hidden_weight, precision: MatmulPrecision | None = None):
    """The Elman RNN over x (B, T, I) from state h (B, H): outputs (B, T, H), final h.
    `precision`: as for gru_sequence."""
    inputs = (x, h, input_weight, input_bias, hidden_weight)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h = _rnn_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), h
    inputs = tuple(t.to(x.dtype) for t in inputs)  # cast outside the Function: autograd casts the grads back
    dtypes = _matmul_dtypes(precision, x, input_weight, hidden_weight)
    if _needs_grad(*inputs):
        outputs = _RNNFunction.apply(*inputs, dtypes)
    else:
        with torch.autocast(x.device.type, enabled=False):
            outputs = _rnn_forward(*inputs, dtypes)[0][1:]
    return outputs.transpose(0, 1), outputs[-1]


def _rnn_one_step(x, h, W_x, b, W_h):
    """One step without grad, for stateful sampling (see _gru_one_step)."""
    p = torch.addmm(b, x, W_x.t())
    return torch.addmm(p, h.to(p.dtype), W_h.t().to(p.dtype)).tanh_()


def _rnn_forward(x, h0, W_x, b, W_h, dtypes=(None, None)):
    dtype_x, dtype_h = dtypes
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    Hs = X.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    P = Hs[1:].view(T * B, H)  # the input side of every step, written in place
    if dtype_x is None:
        torch.addmm(b, X, W_x.t(), out=P)
    else:
        X, W_x = X.to(dtype_x), W_x.to(dtype_x)
        torch.add(torch.mm(X, W_x.t()), b, out=P)
    matmul = _StepMatmul(W_h.t(), B, T, dtype_h)
    h = Hs[0]
    for y in Hs[1:].unbind(0):
        h = matmul.addmm_(y, h).tanh_()
    return Hs, X, W_x


class _RNNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, W_x, b, W_h, dtypes):
        with torch.autocast(x.device.type, enabled=False):
            Hs, X, W_x_used = _rnn_forward(x, h0, W_x, b, W_h, dtypes)
        ctx.save_for_backward(X, W_x_used, W_h, Hs)
        ctx.x_shape, ctx.dtypes = x.shape, dtypes
        return Hs[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y):
        X, W_x, W_h, Hs = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, W_x, b, W_h
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, dA_low, grad_h0, grad_W_h = _rnn_backward(grad_Y.to(Hs.dtype), W_h, Hs, needs, ctx.dtypes)
            grad_x, grad_W_x, grad_b = _input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[2],
                                                         needs[3])
        return grad_x, grad_h0, grad_W_x, grad_b, grad_W_h, None


def _rnn_backward(grad_Y, W_h, Hs, needs, dtypes=(None, None)):
    dtype_x, dtype_h = dtypes
    T, B, H = grad_Y.shape
    one = torch.ones((), dtype=Hs.dtype, device=Hs.device)
    dA = torch.addcmul(one, Hs[1:], Hs[1:], value=-1)  # tanh' = 1 − h_t², all steps; step t turns it into da_t
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    matmul = _StepMatmul(W_h, B, T, dtype_h)
    delta = grad_Y[-1]
    for g_prev, da in zip(reversed(grad_prev), reversed(dA.unbind(0))):
        da.mul_(delta)  # da_t = δ_t ⊙ (1 − h_t²)
        delta = matmul.addmm(g_prev, da)  # δ_{t-1} = da_t @ W_h + ∂L/∂y_{t-1}
    flat = dA.view(T * B, H)
    low = dtype_x or dtype_h  # dA cast once, for every matmul that takes it in bf16
    flat_low = flat.to(low) if low else None
    grad_W_h = _mm_t(flat, Hs[:-1].reshape(T * B, H), flat_low, dtype_h) if needs[4] else None
    return dA, flat_low, (delta if needs[1] else None), grad_W_h
