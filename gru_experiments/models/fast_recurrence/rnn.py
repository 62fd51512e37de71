"""The fast Elman RNN layer: rnn_sequence (see __init__.py and docs/performance.md)."""

import torch
from torch.autograd.function import once_differentiable

from gru_experiments.models.fast_recurrence.common import (
    StepMatmul,
    input_projection,
    input_side_grads,
    mm_t,
    run_h_only,
    time_major,
)
from gru_experiments.models.precision import MatmulPrecision


# Elman: a = P + W_h·h (P = W_x·x + b, all steps in one matmul), h' = tanh(a).
# Backward, with δ = ∂L/∂h_t in total:  da = δ ⊙ (1 − h'²);  δ_{t-1} = da @ W_h + ∂L/∂y_{t-1};
# dW_h = Σ_t daᵀ h_{t-1} (one matmul); dW_x = dAᵀX, dx = dA·W_x, db = Σ dA; dh_0 = δ_0.
def rnn_sequence(x, h, input_weight, input_bias, hidden_weight, precision: MatmulPrecision | None = None):
    """The Elman RNN over x (B, T, I) from state h (B, H): outputs (B, T, H), final h.
    `precision`: as for gru_sequence."""
    inputs = (x, h, input_weight, input_bias, hidden_weight)
    return run_h_only(_RNNFunction, _rnn_one_step, inputs, precision, (input_weight, hidden_weight))


def _rnn_one_step(x, h, W_x, b, W_h):
    """One step without grad, for stateful sampling (see _gru_one_step)."""
    p = torch.addmm(b, x, W_x.t())
    return torch.addmm(p, h.to(p.dtype), W_h.t().to(p.dtype)).tanh_()


def _rnn_forward(x, h0, W_x, b, W_h, dtypes=(None, None)):
    dtype_x, dtype_h = dtypes
    B, T, _ = x.shape
    H = h0.shape[1]
    X = time_major(x)
    Hs = X.new_empty(T + 1, B, H)  # h_0 .. h_T: Hs[1:] are the outputs, Hs[:-1] the h_{t-1} for backward
    Hs[0] = h0
    # The input side of every step, written in place into the outputs.
    _, X, W_x = input_projection(X, W_x, b, dtype_x, out=Hs[1:].view(T * B, H))
    matmul = StepMatmul(W_h.t(), B, T, dtype_h)
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
            grad_x, grad_W_x, grad_b = input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[2],
                                                         needs[3])
        return grad_x, grad_h0, grad_W_x, grad_b, grad_W_h, None


def _rnn_backward(grad_Y, W_h, Hs, needs, dtypes=(None, None)):
    dtype_x, dtype_h = dtypes
    T, B, H = grad_Y.shape
    one = torch.ones((), dtype=Hs.dtype, device=Hs.device)
    dA = torch.addcmul(one, Hs[1:], Hs[1:], value=-1)  # tanh' = 1 − h_t², all steps; step t turns it into da_t
    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    matmul = StepMatmul(W_h, B, T, dtype_h)
    delta = grad_Y[-1]
    for g_prev, da in zip(reversed(grad_prev), reversed(dA.unbind(0))):
        da.mul_(delta)  # da_t = δ_t ⊙ (1 − h_t²)
        delta = matmul.addmm(g_prev, da)  # δ_{t-1} = da_t @ W_h + ∂L/∂y_{t-1}
    flat = dA.view(T * B, H)
    low = dtype_x or dtype_h  # dA cast once, for every matmul that takes it in bf16
    flat_low = flat.to(low) if low else None
    grad_W_h = mm_t(flat, Hs[:-1].reshape(T * B, H), flat_low, dtype_h) if needs[4] else None
    return dA, flat_low, (delta if needs[1] else None), grad_W_h
