"""The fast GRU layer: gru_sequence (see __init__.py and docs/performance.md)."""

import torch
from torch.autograd.function import once_differentiable

from gru_experiments.models.fast_recurrence.common import (
    StepMatmul,
    input_projection,
    input_side_grads,
    mm_t,
    run_h_only,
    sigmoid_backward,
    step_slice,
    tanh_backward,
    time_major,
)
from gru_experiments.models.precision import MatmulPrecision


def gru_sequence(x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate,
                 precision: MatmulPrecision | None = None):
    """The study's GRU over x (B, T, I) from state h (B, H): outputs (B, T, H), final h.
    `precision`: which matmuls take bf16 inputs (None: autocast's choice, else none)."""
    inputs = (x, h, input_weight, input_bias, hidden_weight_rz, hidden_bias_rz, hidden_weight_candidate)
    return run_h_only(_GRUFunction, _gru_one_step, inputs, precision,
                      (input_weight, hidden_weight_rz, hidden_weight_candidate))


def _gru_one_step(x, h, W_x, b_x, W_rz, b_rz, W_h):
    """One step without grad, for stateful sampling: the same formulas with the fewest ops."""
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
    X = time_major(x)
    bias = b_x.clone()
    bias[: 2 * H] += b_rz  # b_r and b_z join their input-side biases; the candidate has no hidden bias
    # The input side of every step in one matmul: A = [a_r | a_z | a_c] still without
    # the hidden terms. The loop adds those in place and applies the activations, so A
    # ends up holding [r | z | h̃] for every step: what backward needs, in the same
    # buffer (fresh large buffers are not free: first-touch page faults).
    A, X, W_x = input_projection(X, W_x, bias, dtype_x)
    A = A.view(T, B, 3 * H)
    Hs = A.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    rz_matmul, c_matmul = StepMatmul(W_rz.t(), B, T, dtype_rz), StepMatmul(W_h.t(), B, T, dtype_h)
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
            grad_x, grad_W_x, grad_bias = input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[2],
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
    sigmoid_backward(H_prev, R, grad_input=K_r)  # h r (1 − r)
    torch.sub(C, H_prev, out=K_z)
    sigmoid_backward(K_z, Z, grad_input=K_z)  # (h̃ − h) z (1 − z)
    tanh_backward(Z, C, grad_input=K_c)  # z (1 − h̃²)
    one_minus_z = 1 - Z

    # ∂L/∂y_{t-1} for each t (nothing before step 0): the term δ_{t-1} starts from.
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    steps = list(zip(grad_prev, K_r.unbind(0), K_z.unbind(0), K_c.unbind(0), dA[..., : 2 * H].unbind(0),
                     one_minus_z.unbind(0), R.unbind(0)))
    dq_matmul, rz_matmul = StepMatmul(W_h, B, T, dtype_h), StepMatmul(W_rz, B, T, dtype_rz)
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
        grad_W_rz = mm_t(flat[:, : 2 * H], H_prev.reshape(T * B, H), step_slice(flat_low, 0, 2 * H), dtype_rz)
    if needs[6]:
        # q_t = r_t ⊙ h_{t-1}, into a buffer now free (or straight in bf16)
        Q = torch.mul(R, H_prev, out=one_minus_z if dtype_h is None else None)
        grad_W_h = mm_t(flat[:, 2 * H:], Q.reshape(T * B, H), step_slice(flat_low, 2 * H, 3 * H), dtype_h)
    return dA, flat_low, (delta if needs[1] else None), grad_W_rz, grad_W_h
