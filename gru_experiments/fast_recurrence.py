r"""Fast paths for the layers in `cells.py`: the same formulas, fewer and bigger ops.

Where the time goes
-------------------
The readable `step` does six small matmuls per GRU time step, and autograd records
~20 nodes per step; at the study's shapes (B=64, T=128, H<=768) on a CPU the
per-op overhead of recording, and of replaying every node backwards, costs as much
as the arithmetic. So this module:

1. projects the input side of all T steps in one matmul per layer, biases folded in
   (ordinary autograd: its backward is one matmul for dW_x, one for dx, one sum);
2. runs the recurrence in a custom `torch.autograd.Function` whose forward runs under
   no_grad, writes every step's activations into preallocated (T, B, ·) buffers
   (out= ops, no torch.stack), and saves only those: GRU h, [r|z], h̃; LSTM h, c and
   the four gates. (r ⊙ h and tanh c are recomputed in backward in one pass each.)
3. whose backward walks only the *hidden state* recurrence backwards step by step (the
   truly sequential part), writing the gate pre-activation gradients dA_t into one
   (T, B, ·) buffer, then gets every weight gradient as a single matmul over all
   time steps:  dW = dAᵀ · H_prev  with dA viewed as (T·B, ·) — one big GEMM
   instead of T small ones. dA is also the gradient of the projected inputs, so the
   input-side gradients (dW_x, db, dx) are single matmuls in autograd's addmm backward;
4. precomputes, vectorised over all T before the backward loop, every factor of the
   backward that does not depend on the incoming gradient (σ'(·), tanh'(·) products,
   with aten's fused sigmoid_backward/tanh_backward), *into the dA buffer itself*:
   step t multiplies its own K_t by δ in place, so the loop does ~6 ops per step and
   no (T, B, ·) temporaries are allocated (fresh large buffers cost first-touch page
   faults, measured at ~1/3 of the small-shape runtime before this);
5. runs each step's hidden matmul through `_StepMatmul`: for big weights, MKL's packed
   GEMM (the weight reordered once per sequence instead of once per step — 2x on the
   LSTM's (64×1024)·(1024×4096)); for small ones a contiguous copy of Wᵀ.

Tensors are kept time-major (T, B, ·) inside, so a step's slice is contiguous; a layer
returns a (B, T, H) *view* of its time-major output, which makes the next layer's
time-major input free. Without grad (evaluation) the same forward kernel runs without
the autograd.Function around it; a single step without grad (stateful sampling, one
token at a time) takes a shortcut with the fewest ops, so the cost per sampled token
is constant and close to nn.GRU's.

The backward equations
----------------------
Notation: for each step t, h = h_{t-1}, h' = h_t, and δ = ∂L/∂h_t *in total*, i.e. the
gradient arriving from the output y_t = h_t plus the one carried back from step t+1.
P_t is the projected input (input side + all biases), split like the gates.

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
    dP_t = [da_r | da_z | da_c]                → autograd: dW_x, db_x, db_r, db_z, dx
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
    dW = Σ_t dA_tᵀ h_{t-1}   (one matmul);  dP = dA;  dh_0 = δ_0, dc_0 = γ_0.

Dtypes and devices: nothing here names a device; the loop runs in the dtype of the
projected inputs (under autocast that is bf16/fp16: hidden weights and the initial
state are cast to it *outside* the Function, so autograd casts their gradients back).
The Function turns autocast off inside, because out= ops and autocast don't mix.
Double backward is not supported (`once_differentiable`).
tests/test_fast_recurrence.py holds all of this to the reference within 1e-5.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def run_fast(layer, x: Tensor, state):
    """One layer over a whole sequence: x (B, T, I) -> outputs (B, T, H), final state."""
    from gru_experiments.cells import GRULayer, LSTMLayer

    if isinstance(layer, GRULayer):
        return gru_sequence(x, state, layer.input_weight, layer.input_bias,
                            layer.hidden_weight_rz, layer.hidden_bias_rz, layer.hidden_weight_candidate)
    if isinstance(layer, LSTMLayer):
        return lstm_sequence(x, state, layer.input_weight, layer.input_bias, layer.hidden_weight)
    raise TypeError(f"no fast path for {type(layer).__name__}")


def _project(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Input side of every step in one matmul: (B, T, I) -> time-major (T, B, G)."""
    B, T, I = x.shape
    # transpose+reshape copies x only if it is not already time-major in memory (a
    # previous fast layer's output is), and x is narrower than the projection.
    x_tm = x.transpose(0, 1).reshape(T * B, I)
    return torch.addmm(bias, x_tm, weight.t()).view(T, B, -1)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# MKL's packed GEMM (a private op of x86 CPU builds, the one inductor uses for frozen
# linears): the weight is reordered once, then reused by every step. oneDNN's LSTM
# does the same. An ordinary mm re-packs the weight on every call, which costs as much
# as the multiply itself for a big weight and a thin (batch-row) input: measured on a
# Xeon @2.5GHz, (64×1024)·(1024×4096) runs at 51 instead of 25 GMAC/s, no gain below
# ~0.5M weight elements (the weight then stays in cache anyway). Worth it only
# when the weight is big and there are enough steps to repay the reorder.
PACKED_MIN_WEIGHT_ELEMENTS = 400_000  # ~1.6 MB of fp32: e.g. the GRU's H×2H from H=448, an LSTM's from H=320
PACKED_MIN_STEPS = 16
_HAS_MKL_PACKED = hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and torch.backends.mkl.is_available()


class _StepMatmul:
    """`acc + x @ M` for many x of one shape (B, K), M (K, N) fixed across the T steps."""

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

    def addmm(self, acc: Tensor, x: Tensor, out: Tensor | None = None) -> Tensor:
        if self.packed is None:
            return torch.addmm(acc, x, self.M, out=out)
        product = torch.ops.mkl._mkl_linear(x, self.packed, self.linear_weight, None, self.batch)
        return torch.add(acc, product, out=out)

    def mm(self, x: Tensor) -> Tensor:
        if self.packed is None:
            return torch.mm(x, self.M)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.linear_weight, None, self.batch)


# ----------------------------------------------------------------------------------- GRU
def gru_sequence(x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate):
    H = hidden_weight_candidate.shape[0]
    if x.shape[1] == 1 and not _needs_grad(x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz,
                                           hidden_weight_candidate):
        h = _gru_one_step(x[:, 0], h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz,
                          hidden_weight_candidate)
        return h.unsqueeze(1), h
    # b_r and b_z join their input-side biases; the candidate has no hidden bias.
    bias = input_bias + torch.cat([hidden_bias_rz, hidden_bias_rz.new_zeros(H)])
    projected = _project(x, input_weight, bias)  # (T, B, 3H): [r | z | candidate]
    dtype = projected.dtype  # the compute dtype (lower under autocast)
    h0, W_rz, W_h = h.to(dtype), hidden_weight_rz.to(dtype), hidden_weight_candidate.to(dtype)
    if _needs_grad(projected, h0, W_rz, W_h):
        outputs = _GRUFunction.apply(projected, h0, W_rz, W_h)
    else:
        outputs = _gru_forward(projected, h0, W_rz, W_h)[0][1:]
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


def _gru_forward(P: Tensor, h0: Tensor, W_rz: Tensor, W_h: Tensor):
    T, B, _ = P.shape
    H = h0.shape[1]
    Hs = P.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    RZ = P.new_empty(T, B, 2 * H)  # σ(a_r) | σ(a_z), saved for backward
    C = P.new_empty(T, B, H)  # h̃, saved for backward
    q = P.new_empty(B, H)  # r ⊙ h_{t-1}: one scratch row, backward recomputes all q from R and Hs
    rz_matmul, c_matmul = _StepMatmul(W_rz.t(), B, T), _StepMatmul(W_h.t(), B, T)
    h = h0
    # unbind once: the per-step views are made in C++ in one go, not by T×7 Python indexings.
    for p_rz, p_c, rz, r, z, c, y in zip(P[..., : 2 * H].unbind(0), P[..., 2 * H:].unbind(0), RZ.unbind(0),
                                         RZ[..., :H].unbind(0), RZ[..., H:].unbind(0), C.unbind(0),
                                         Hs[1:].unbind(0)):
        rz_matmul.addmm(p_rz, h, out=rz).sigmoid_()  # r and z in one (H -> 2H) matmul
        torch.mul(r, h, out=q)  # reset before the candidate matmul (the study's GRU)
        c_matmul.addmm(p_c, q, out=c).tanh_()
        h = torch.lerp(h, c, z, out=y)  # (1 − z) ⊙ h + z ⊙ h̃ in one op
    return Hs, RZ, C


class _GRUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, P, h0, W_rz, W_h):
        with torch.autocast(P.device.type, enabled=False):
            Hs, RZ, C = _gru_forward(P, h0, W_rz, W_h)
        ctx.save_for_backward(W_rz, W_h, Hs, RZ, C)
        return Hs[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y):
        W_rz, W_h, Hs, RZ, C = ctx.saved_tensors
        with torch.autocast(grad_Y.device.type, enabled=False):
            return _gru_backward(grad_Y.to(Hs.dtype), W_rz, W_h, Hs, RZ, C, ctx.needs_input_grad)


# Fused pointwise derivatives (one pass each, no temporaries):
#   sigmoid_backward(g, y) = g ⊙ y ⊙ (1 − y)     tanh_backward(g, y) = g ⊙ (1 − y²)
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input


def _gru_backward(grad_Y, W_rz, W_h, Hs, RZ, C, needs_input_grad):
    T, B, H = C.shape
    H_prev = Hs[:-1]  # h_{t-1} for every t
    R, Z = RZ[..., :H], RZ[..., H:]
    # Every factor that does not depend on δ, for all steps at once (see the module
    # docstring), written into the buffer that becomes dP: step t's loop turns its own
    # K_t into dP_t in place, so one (T, B, 3H) buffer serves both. (Fresh large
    # buffers are not free: first-touch page faults cost about as much as a pass.)
    dP = C.new_empty(T, B, 3 * H)
    K_r, K_z, K_c = dP[..., :H], dP[..., H: 2 * H], dP[..., 2 * H:]
    _sigmoid_backward(H_prev, R, grad_input=K_r)  # h r (1 − r)
    torch.sub(C, H_prev, out=K_z)
    _sigmoid_backward(K_z, Z, grad_input=K_z)  # (h̃ − h) z (1 − z)
    _tanh_backward(Z, C, grad_input=K_c)  # z (1 − h̃²)
    one_minus_z = 1 - Z

    # ∂L/∂y_{t-1} for each t (nothing before step 0): the term δ_{t-1} starts from.
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    steps = list(zip(grad_prev, K_r.unbind(0), K_z.unbind(0), K_c.unbind(0), dP[..., : 2 * H].unbind(0),
                     one_minus_z.unbind(0), R.unbind(0)))
    dq_matmul, rz_matmul = _StepMatmul(W_h, B, T), _StepMatmul(W_rz, B, T)
    delta = grad_Y[-1]
    for g_prev, da_r, da_z, da_c, da_rz, omz, r in reversed(steps):
        da_z.mul_(delta)  # da_z = δ ⊙ K_z
        da_c.mul_(delta)  # da_c = δ ⊙ K_c
        dq = dq_matmul.mm(da_c)  # gradient of q = r ⊙ h
        da_r.mul_(dq)  # da_r = dq ⊙ h ⊙ σ'(a_r)
        new_delta = rz_matmul.addmm(g_prev, da_rz)  # through both gate matmuls
        new_delta.addcmul_(delta, omz)  # direct path through the interpolation
        delta = new_delta.addcmul_(dq, r)  # h's own share of r ⊙ h

    flat = dP.view(T * B, 3 * H)
    grad_W_rz = flat[:, : 2 * H].t().mm(H_prev.reshape(T * B, H)) if needs_input_grad[2] else None
    grad_W_h = None
    if needs_input_grad[3]:
        Q = torch.mul(R, H_prev, out=one_minus_z)  # q_t = r_t ⊙ h_{t-1}, into a buffer now free
        grad_W_h = flat[:, 2 * H:].t().mm(Q.view(T * B, H))
    grad_h0 = delta if needs_input_grad[1] else None
    return dP, grad_h0, grad_W_rz, grad_W_h


# ---------------------------------------------------------------------------------- LSTM
def lstm_sequence(x, state, input_weight, input_bias, hidden_weight):
    h, c = state
    if x.shape[1] == 1 and not _needs_grad(x, h, c, input_weight, input_bias, hidden_weight):
        h, c = _lstm_one_step(x[:, 0], h, c, input_weight, input_bias, hidden_weight)
        return h.unsqueeze(1), (h, c)
    projected = _project(x, input_weight, input_bias)  # (T, B, 4H): [i | f | g | o]
    dtype = projected.dtype
    h0, c0, W = h.to(dtype), c.to(dtype), hidden_weight.to(dtype)
    if _needs_grad(projected, h0, c0, W):
        outputs, c_last = _LSTMFunction.apply(projected, h0, c0, W)
    else:
        Hs, Cs, _ = _lstm_forward(projected, h0, c0, W)
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


def _lstm_forward(P: Tensor, h0: Tensor, c0: Tensor, W: Tensor):
    T, B, _ = P.shape
    H = h0.shape[1]
    G = P.new_empty(T, B, 4 * H)  # activated gates i, f, g, o
    Hs = P.new_empty(T + 1, B, H)  # h_0 .. h_T (outputs are Hs[1:])
    Cs = P.new_empty(T + 1, B, H)  # c_0 .. c_T
    Hs[0], Cs[0] = h0, c0
    tc = P.new_empty(B, H)  # tanh(c_t): one scratch row, backward recomputes it from Cs
    matmul = _StepMatmul(W.t(), B, T)
    h, c = h0, c0
    for p, g, i_f, i, f, g_g, o, c_t, y in zip(
            P.unbind(0), G.unbind(0), G[..., : 2 * H].unbind(0), G[..., :H].unbind(0), G[..., H: 2 * H].unbind(0),
            G[..., 2 * H: 3 * H].unbind(0), G[..., 3 * H:].unbind(0), Cs[1:].unbind(0), Hs[1:].unbind(0)):
        matmul.addmm(p, h, out=g)  # all four gates' hidden matmuls at once
        i_f.sigmoid_()
        g_g.tanh_()
        o.sigmoid_()
        c = torch.mul(f, c, out=c_t).addcmul_(i, g_g)  # f ⊙ c + i ⊙ g
        h = torch.mul(o, torch.tanh(c, out=tc), out=y)
    return Hs, Cs, G


class _LSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, P, h0, c0, W):
        with torch.autocast(P.device.type, enabled=False):
            Hs, Cs, G = _lstm_forward(P, h0, c0, W)
        ctx.save_for_backward(W, Hs, Cs, G)
        # c_T is returned as its own tensor (a clone, not a view of the saved buffer).
        return Hs[1:], Cs[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_Y, grad_c_last):
        W, Hs, Cs, G = ctx.saved_tensors
        with torch.autocast(grad_Y.device.type, enabled=False):
            return _lstm_backward(grad_Y.to(Hs.dtype), grad_c_last.to(Hs.dtype), W, Hs, Cs, G, ctx.needs_input_grad)


def _lstm_backward(grad_Y, grad_c_last, W, Hs, Cs, G, needs_input_grad):
    T, B, H4 = G.shape
    H = H4 // 4
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

    grad_W = dA.view(T * B, 4 * H).t().mm(Hs[:-1].reshape(T * B, H)) if needs_input_grad[3] else None
    return (dA, delta if needs_input_grad[1] else None, gamma if needs_input_grad[2] else None, grad_W)
