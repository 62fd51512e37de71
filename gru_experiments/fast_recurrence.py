r"""Fast paths for the layers in `cells.py`: the same formulas, fewer and bigger ops.

Where the time goes
-------------------
The readable `step` does six small matmuls per GRU time step, and autograd records
~20 nodes per step; at the study's shapes (B=64, T=128, H<=768) on a CPU the
per-op overhead of recording, and of replaying every node backwards, costs as much
as the arithmetic. So this module:

1. runs each layer as one custom `torch.autograd.Function` whose forward runs under
   no_grad: the input side of all T steps is one matmul (biases folded in), and the
   loop adds each step's hidden side into that same buffer in place and applies the
   activations there, so it ends up holding every step's gates — the only large
   tensors saved besides h (and c): GRU [r | z | h̃], LSTM [i | f | g | o].
   (r ⊙ h and tanh c are recomputed in backward, one pass each.) No torch.stack;
2. whose backward walks only the *hidden state* recurrence backwards step by step (the
   truly sequential part), writing the gate pre-activation gradients dA_t into one
   (T, B, ·) buffer, then gets every weight gradient as a single matmul over all
   time steps:  dW = dAᵀ · H_prev  with dA viewed as (T·B, ·) — one big GEMM
   instead of T small ones; dA is also the gradient of the input projection, so
   dx = dA·W_x, dW_x = dAᵀ·X and db = Σ dA are one matmul (one sum) each;
3. precomputes, vectorised over all T before the backward loop, every factor of the
   backward that does not depend on the incoming gradient (σ'(·), tanh'(·) products,
   with aten's fused sigmoid_backward/tanh_backward), *into the dA buffer itself*:
   step t multiplies its own K_t by δ in place, so the loop does ~6 ops per step and
   allocates no (T, B, ·) temporaries. (Fresh large buffers are not free: first-touch
   page faults cost ~3 µs per 4 KiB page on the VM this was measured on, as much as
   several passes over the memory.)
4. runs each step's hidden matmul through `_StepMatmul`: for big weights, MKL's packed
   GEMM (the weight reordered once per sequence instead of once per step — 2x on the
   LSTM's (64×1024)·(1024×4096)); for small ones a contiguous copy of Wᵀ.

Tensors are kept time-major (T, B, ·) inside, so a step's slice is contiguous; a layer
returns a (B, T, H) *view* of its time-major output, which makes the next layer's
time-major input free. Without grad (evaluation) the same forward kernel runs without
the autograd.Function around it; a single step without grad (stateful sampling, one
token at a time) takes a shortcut with the fewest ops, so the cost per sampled token
is constant and close to PyTorch's built-in GRU's.

The backward equations
----------------------
Notation: for each step t, h = h_{t-1}, h' = h_t, and δ = ∂L/∂h_t *in total*, i.e. the
gradient arriving from the output y_t = h_t plus the one carried back from step t+1.
P_t is the projected input (input side + all biases, X·W_xᵀ + b), split like the gates.

GRU (the study's variant: reset applied to h *before* the candidate matmul)::

    a_r = P_r + W_rh·h        r = σ(a_r)
    a_z = P_z + W_zh·h        z = σ(a_z)
    q   = r ⊙ h
    a_c = P_c + W_h·q         h̃ = tanh(a_c)
    h'  = (1 − z) ⊙ h + z ⊙ h̃   (computed as lerp(h, h̃, z) = h + z ⊙ (h̃ − h))

Backward, with σ' = σ(1 − σ) and tanh' = 1 − tanh²::

    da_z = δ ⊙ (h̃ − h) ⊙ z(1 − z)             = δ ⊙ K_z,   K_z = (h̃ − h) z (1 − z)
    da_c = δ ⊙ z ⊙ (1 − h̃²)                   = δ ⊙ K_c,   K_c = z (1 − h̃²)
    dq   = W_hᵀ·da_c                            (row form: dq = da_c @ W_h)
    # q = r ⊙ h: the reset gate and h both receive gradient through the product
    da_r = dq ⊙ h ⊙ r(1 − r)                  = dq ⊙ K_r,  K_r = h r (1 − r)
    δ_{t-1} = δ ⊙ (1 − z)                      direct path through the interpolation
            + dq ⊙ r                          through q = r ⊙ h (the reset path)
            + [da_r | da_z] @ [W_rh ; W_zh]   through both gates' hidden matmuls
            + ∂L/∂y_{t-1}

    dW_h          = Σ_t da_cᵀ q_t              one (H, T·B)×(T·B, H) matmul
    [dW_rh; dW_zh] = Σ_t [da_r|da_z]ᵀ h_{t-1}  one (2H, T·B)×(T·B, H) matmul
    dP_t = [da_r | da_z | da_c]                → dW_x = dPᵀX, dx = dP·W_x, db_x = Σ dP, [db_r; db_z] = Σ [da_r|da_z]
    dh_0 = δ_0 after the last backward step.

LSTM (one bias per gate, input side; gate rows [i | f | g | o])::

    [a_i, a_f, a_g, a_o] = P + W·h;  i, f, o = σ(·), g = tanh(a_g)
    c' = f ⊙ c + i ⊙ g;   h' = o ⊙ tanh(c')

Backward, with δ = ∂L/∂h_t in total and γ = ∂L/∂c_t arriving from step t+1 (or
from the final state c_T)::

    γ    += δ ⊙ o ⊙ (1 − tanh²c')             = δ ⊙ K_c,  K_c = o (1 − tanh² c')
    da_o  = δ ⊙ tanh c' ⊙ o(1 − o)            = δ ⊙ K_o
    da_i  = γ ⊙ g ⊙ i(1 − i)                  = γ ⊙ K_i
    da_f  = γ ⊙ c ⊙ f(1 − f)                  = γ ⊙ K_f
    da_g  = γ ⊙ i ⊙ (1 − g²)                  = γ ⊙ K_g
    γ_{t-1} = γ ⊙ f
    δ_{t-1} = dA_t @ W + ∂L/∂y_{t-1}
    dW = Σ_t dA_tᵀ h_{t-1}   (one matmul);  dW_x = dAᵀX, dx = dA·W_x, db = Σ dA;
    dh_0 = δ_0, dc_0 = γ_0.

Dtypes and devices: nothing here names a device; the loop runs in autocast's dtype
when autocast is on (bf16/fp16: input, weights and initial state are cast to it
*outside* the Function, so autograd casts their gradients back), else in the input's.
The Function turns autocast off inside, because out=/in-place ops and autocast don't mix.
Double backward is not supported (`once_differentiable`).
tests/test_fast_recurrence.py holds all of this to the reference within 1e-5.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


# ------------------------------------------------------------------------------- helpers
def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the recurrence runs in: autocast's when it is on (the reference's
    matmuls would run in it too), else the input's."""
    device = x.device.type
    try:
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    except TypeError:  # torch < 2.4 spells these per device
        if device == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        if device == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return x.dtype


def _time_major(x: Tensor) -> Tensor:
    """(B, T, I) -> (T·B, I), rows step-major. Copies x only if it is not time-major in
    memory already; a previous fast layer's output (through dropout) is."""
    B, T, I = x.shape
    return x.transpose(0, 1).reshape(T * B, I)


def _input_side_grads(dA: Tensor, X: Tensor, W_x: Tensor, x_shape, needs_x: bool, needs_W: bool, needs_b: bool):
    """Gradients of the input projection A = X·W_xᵀ + b: each one matmul (or one sum)
    over all T·B rows at once."""
    flat = dA.view(X.shape[0], -1)
    grad_x = grad_W = grad_b = None
    if needs_x:
        B, T, I = x_shape
        grad_x = flat.mm(W_x).view(T, B, I).transpose(0, 1)
    if needs_W:
        grad_W = flat.t().mm(X)
    if needs_b:
        grad_b = flat.sum(0)
    return grad_x, grad_W, grad_b


# MKL's packed GEMM (a private op of x86 CPU builds, the one inductor uses for frozen
# linears): the weight is reordered once, then reused by every step. oneDNN's LSTM
# does the same. An ordinary mm re-packs the weight on every call, which costs as much
# as the multiply itself for a big weight and a thin (batch-row) input: measured on a
# Xeon @2.5GHz, (64×1024)·(1024×4096) runs at 51 instead of 25 GMAC/s, no gain below
# ~0.5M weight elements (the weight then stays in cache anyway). Worth it only
# when the weight is big and there are enough steps to repay the reorder.
PACKED_MIN_WEIGHT_ELEMENTS = 400_000  # ~1.6 MB of fp32: the GRU's H×2H from H=448, an LSTM's H×4H from H=320
PACKED_MIN_STEPS = 16
_HAS_MKL_PACKED = hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and torch.backends.mkl.is_available()


class _StepMatmul:
    """`x @ M` for many x of one shape (B, K), M (K, N) fixed across the T steps."""

    def __init__(self, M: Tensor, batch: int, steps: int):
        self.batch = batch
        self.packed = None
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

    def mm(self, x: Tensor) -> Tensor:
        if self.packed is None:
            return torch.mm(x, self.M)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.linear_weight, None, self.batch)

    def addmm(self, acc: Tensor, x: Tensor) -> Tensor:
        """acc + x @ M, a new tensor."""
        if self.packed is None:
            return torch.addmm(acc, x, self.M)
        return self.mm(x).add_(acc)

    def addmm_(self, acc: Tensor, x: Tensor) -> Tensor:
        """acc += x @ M, in place."""
        if self.packed is None:
            return acc.addmm_(x, self.M)
        return acc.add_(self.mm(x))


# Fused pointwise derivatives (one pass each, no temporaries):
#   sigmoid_backward(g, y) = g ⊙ y ⊙ (1 − y)     tanh_backward(g, y) = g ⊙ (1 − y²)
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input


# ----------------------------------------------------------------------------------- GRU
def gru_sequence(x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate):
    inputs = (x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h = _gru_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), h
    dtype = _compute_dtype(x)
    inputs = tuple(t.to(dtype) for t in inputs)  # cast outside the Function: autograd casts the grads back
    if _needs_grad(*inputs):
        outputs = _GRUFunction.apply(*inputs)
    else:
        outputs = _gru_forward(*inputs)[0][1:]
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


def _gru_forward(x, h0, W_x, b_x, W_rz, b_rz, W_h):
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    bias = b_x.clone()
    bias[: 2 * H] += b_rz  # b_r and b_z join their input-side biases; the candidate has no hidden bias
    # The input side of every step in one matmul: A = [a_r | a_z | a_c] still without
    # the hidden terms. The loop adds those in place and applies the activations, so A
    # ends up holding [r | z | h̃] for every step: what backward needs, in the same
    # buffer (fresh large buffers are not free: first-touch page faults).
    A = torch.addmm(bias, X, W_x.t()).view(T, B, 3 * H)
    Hs = A.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    q = A.new_empty(B, H)  # r ⊙ h_{t-1}: one scratch row; backward recomputes all q from R and Hs
    rz_matmul, c_matmul = _StepMatmul(W_rz.t(), B, T), _StepMatmul(W_h.t(), B, T)
    h = h0
    # unbind once: the per-step views are made in C++ in one go, not by T×5 Python indexings.
    for rz, r, z, c, y in zip(A[..., : 2 * H].unbind(0), A[..., :H].unbind(0), A[..., H: 2 * H].unbind(0),
                              A[..., 2 * H:].unbind(0), Hs[1:].unbind(0)):
        rz_matmul.addmm_(rz, h).sigmoid_()  # r and z: one (H -> 2H) matmul
        torch.mul(r, h, out=q)  # reset applied *before* the candidate matmul (the study's GRU)
        c_matmul.addmm_(c, q).tanh_()
        h = torch.lerp(h, c, z, out=y)  # (1 − z) ⊙ h + z ⊙ h̃ in one op
    return Hs, A, X


class _GRUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, W_x, b_x, W_rz, b_rz, W_h):
        with torch.autocast(x.device.type, enabled=False):  # out=/in-place ops and autocast don't mix
            Hs, A, X = _gru_forward(x, h0, W_x, b_x, W_rz, b_rz, W_h)
        ctx.save_for_backward(X, W_x, W_rz, W_h, Hs, A)
        ctx.x_shape = x.shape
        return Hs[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y):
        X, W_x, W_rz, W_h, Hs, A = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, W_x, b_x, W_rz, b_rz, W_h
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, grad_h0, grad_W_rz, grad_W_h = _gru_backward(grad_Y.to(A.dtype), W_rz, W_h, Hs, A, needs)
            grad_x, grad_W_x, grad_bias = _input_side_grads(dA, X, W_x, ctx.x_shape, needs[0], needs[2],
                                                            needs[3] or needs[5])
        H = W_h.shape[0]
        grad_b_x = grad_bias if needs[3] else None
        grad_b_rz = grad_bias[: 2 * H] if needs[5] else None  # b_r, b_z sit in the same sums as b_rx, b_zx
        return grad_x, grad_h0, grad_W_x, grad_b_x, grad_W_rz, grad_b_rz, grad_W_h


def _gru_backward(grad_Y, W_rz, W_h, Hs, A, needs):
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
    dq_matmul, rz_matmul = _StepMatmul(W_h, B, T), _StepMatmul(W_rz, B, T)
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
    grad_W_rz = flat[:, : 2 * H].t().mm(H_prev.reshape(T * B, H)) if needs[4] else None
    grad_W_h = None
    if needs[6]:
        Q = torch.mul(R, H_prev, out=one_minus_z)  # q_t = r_t ⊙ h_{t-1}, into a buffer now free
        grad_W_h = flat[:, 2 * H:].t().mm(Q.view(T * B, H))
    return dA, (delta if needs[1] else None), grad_W_rz, grad_W_h


# ---------------------------------------------------------------------------------- LSTM
def lstm_sequence(x, state, input_weight, input_bias, hidden_weight):
    h, c = state
    inputs = (x, h, c, input_weight, input_bias, hidden_weight)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h, c = _lstm_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), (h, c)
    dtype = _compute_dtype(x)
    inputs = tuple(t.to(dtype) for t in inputs)
    if _needs_grad(*inputs):
        outputs, c_last = _LSTMFunction.apply(*inputs)
    else:
        Hs, Cs, _, _ = _lstm_forward(*inputs)
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


def _lstm_forward(x, h0, c0, W_x, b, W):
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    # Input side of every step in one matmul; the loop adds W·h in place and activates,
    # so G ends up holding the gates [i | f | g | o] of every step (see _gru_forward).
    G = torch.addmm(b, X, W_x.t()).view(T, B, 4 * H)
    Hs = G.new_empty(T + 1, B, H)  # h_0 .. h_T (outputs are Hs[1:])
    Cs = G.new_empty(T + 1, B, H)  # c_0 .. c_T
    Hs[0], Cs[0] = h0, c0
    tc = G.new_empty(B, H)  # tanh(c_t): one scratch row; backward recomputes it from Cs
    matmul = _StepMatmul(W.t(), B, T)
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
    return Hs, Cs, G, X


class _LSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, W_x, b, W):
        with torch.autocast(x.device.type, enabled=False):
            Hs, Cs, G, X = _lstm_forward(x, h0, c0, W_x, b, W)
        ctx.save_for_backward(X, W_x, W, Hs, Cs, G)
        ctx.x_shape = x.shape
        # c_T is returned as its own tensor (a clone, not a view of the saved buffer).
        return Hs[1:], Cs[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y, grad_c_last):
        X, W_x, W, Hs, Cs, G = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, c0, W_x, b, W
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, grad_h0, grad_c0, grad_W = _lstm_backward(grad_Y.to(G.dtype), grad_c_last.to(G.dtype),
                                                          W, Hs, Cs, G, needs)
            grad_x, grad_W_x, grad_b = _input_side_grads(dA, X, W_x, ctx.x_shape, needs[0], needs[3], needs[4])
        return grad_x, grad_h0, grad_c0, grad_W_x, grad_b, grad_W


def _lstm_backward(grad_Y, grad_c_last, W, Hs, Cs, G, needs):
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
    matmul = _StepMatmul(W, B, T)
    delta, gamma = grad_Y[-1], grad_c_last
    for g_prev, da, da_i, da_f, da_g, da_o, k_c, f in reversed(steps):
        gamma = torch.addcmul(gamma, delta, k_c)  # ∂L/∂c_t in total
        da_i.mul_(gamma)  # da_i = γ ⊙ K_i (separate multiplies beat one broadcast one here)
        da_f.mul_(gamma)  # da_f = γ ⊙ K_f
        da_g.mul_(gamma)  # da_g = γ ⊙ K_g
        da_o.mul_(delta)  # da_o = δ ⊙ K_o
        gamma.mul_(f)  # γ_{t-1} = γ ⊙ f
        delta = matmul.addmm(g_prev, da)  # δ_{t-1}

    grad_W = dA.view(T * B, 4 * H).t().mm(Hs[:-1].reshape(T * B, H)) if needs[5] else None
    return dA, (delta if needs[1] else None), (gamma if needs[2] else None), grad_W


# ----------------------------------------------------------------------------------- RNN
# Elman: a = P + W_h·h (P = W_x·x + b, all steps in one matmul), h' = tanh(a).
# Backward, with δ = ∂L/∂h_t in total:  da = δ ⊙ (1 − h'²);  δ_{t-1} = da @ W_h + ∂L/∂y_{t-1};
# dW_h = Σ_t daᵀ h_{t-1} (one matmul); dW_x = dAᵀX, dx = dA·W_x, db = Σ dA; dh_0 = δ_0.
def rnn_sequence(x, h, input_weight, input_bias, hidden_weight):
    inputs = (x, h, input_weight, input_bias, hidden_weight)
    if x.shape[1] == 1 and not _needs_grad(*inputs):
        h = _rnn_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), h
    dtype = _compute_dtype(x)
    inputs = tuple(t.to(dtype) for t in inputs)  # cast outside the Function: autograd casts the grads back
    if _needs_grad(*inputs):
        outputs = _RNNFunction.apply(*inputs)
    else:
        outputs = _rnn_forward(*inputs)[0][1:]
    return outputs.transpose(0, 1), outputs[-1]


def _rnn_one_step(x, h, W_x, b, W_h):
    """One step without grad, for stateful sampling (see _gru_one_step)."""
    p = torch.addmm(b, x, W_x.t())
    return torch.addmm(p, h.to(p.dtype), W_h.t().to(p.dtype)).tanh_()


def _rnn_forward(x, h0, W_x, b, W_h):
    B, T, _ = x.shape
    H = h0.shape[1]
    X = _time_major(x)
    Hs = X.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    torch.addmm(b, X, W_x.t(), out=Hs[1:].view(T * B, H))  # the input side of every step, in place
    matmul = _StepMatmul(W_h.t(), B, T)
    h = Hs[0]
    for y in Hs[1:].unbind(0):
        h = matmul.addmm_(y, h).tanh_()
    return Hs, X


class _RNNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, W_x, b, W_h):
        with torch.autocast(x.device.type, enabled=False):
            Hs, X = _rnn_forward(x, h0, W_x, b, W_h)
        ctx.save_for_backward(X, W_x, W_h, Hs)
        ctx.x_shape = x.shape
        return Hs[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y):
        X, W_x, W_h, Hs = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, h0, W_x, b, W_h
        with torch.autocast(grad_Y.device.type, enabled=False):
            dA, grad_h0, grad_W_h = _rnn_backward(grad_Y.to(Hs.dtype), W_h, Hs, needs)
            grad_x, grad_W_x, grad_b = _input_side_grads(dA, X, W_x, ctx.x_shape, needs[0], needs[2], needs[3])
        return grad_x, grad_h0, grad_W_x, grad_b, grad_W_h


def _rnn_backward(grad_Y, W_h, Hs, needs):
    T, B, H = grad_Y.shape
    one = torch.ones((), dtype=Hs.dtype, device=Hs.device)
    dA = torch.addcmul(one, Hs[1:], Hs[1:], value=-1)  # tanh' = 1 − h_t², all steps; step t turns it into da_t
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    matmul = _StepMatmul(W_h, B, T)
    delta = grad_Y[-1]
    for g_prev, da in zip(reversed(grad_prev), reversed(dA.unbind(0))):
        da.mul_(delta)  # da_t = δ_t ⊙ (1 − h_t²)
        delta = matmul.addmm(g_prev, da)  # δ_{t-1} = da_t @ W_h + ∂L/∂y_{t-1}
    grad_W_h = dA.view(T * B, H).t().mm(Hs[:-1].reshape(T * B, H)) if needs[4] else None
    return dA, (delta if needs[1] else None), grad_W_h
