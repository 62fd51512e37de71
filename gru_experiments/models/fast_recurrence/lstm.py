"""The fast LSTM layer: lstm_sequence (see __init__.py and docs/performance.md)."""

import torch
from torch.autograd.function import once_differentiable

from gru_experiments.models.fast_recurrence.common import (
    StepMatmul,
    input_projection,
    input_side_grads,
    matmul_dtypes,
    mm_t,
    needs_grad,
    sigmoid_backward,
    tanh_backward,
    time_major,
)
from gru_experiments.models.precision import MatmulPrecision


def lstm_sequence(x, state, input_weight, input_bias, hidden_weight, precision: MatmulPrecision | None = None):
    """The LSTM over x (B, T, I) from state (h, c): outputs (B, T, H), final (h, c).
    `precision`: as for gru_sequence."""
    h, c = state
    inputs = (x, h, c, input_weight, input_bias, hidden_weight)
    if x.shape[1] == 1 and not needs_grad(*inputs):
        h, c = _lstm_one_step(x[:, 0], *inputs[1:])
        return h.unsqueeze(1), (h, c)
    inputs = tuple(t.to(x.dtype) for t in inputs)
    outputs, c_last = _LSTMFunction.apply(*inputs, matmul_dtypes(precision, x, input_weight, hidden_weight))
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
    X = time_major(x)
    # Input side of every step in one matmul; the loop adds W·h in place and activates,
    # so G ends up holding the gates [i | f | g | o] of every step (see _gru_forward).
    G, X, W_x = input_projection(X, W_x, b, dtype_x)
    G = G.view(T, B, 4 * H)
    Hs = G.new_empty(T + 1, B, H)  # h_0 .. h_T (outputs are Hs[1:])
    Cs = G.new_empty(T + 1, B, H)  # c_0 .. c_T
    Hs[0], Cs[0] = h0, c0
    tc = G.new_empty(B, H)  # tanh(c_t): one scratch row; backward recomputes it from Cs
    matmul = StepMatmul(W.t(), B, T, dtype_W)
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
            grad_x, grad_W_x, grad_b = input_side_grads(dA, dA_low, X, W_x, ctx.x_shape, needs[0], needs[3],
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
    sigmoid_backward(Gg, I, grad_input=K_i)  # g i (1 − i)
    sigmoid_backward(Cs[:-1], F, grad_input=K_f)  # c_{t-1} f (1 − f)
    tanh_backward(I, Gg, grad_input=K_g)  # i (1 − g²)
    K_c = torch.tanh(Cs[1:])  # tanh(c_t) ...
    sigmoid_backward(K_c, O, grad_input=K_o)  # tanh(c_t) o (1 − o)
    tanh_backward(O, K_c, grad_input=K_c)  # ... becomes o (1 − tanh² c_t)

    grad_prev = [torch.zeros_like(Hs[0]), *grad_Y[:-1].unbind(0)]
    steps = list(zip(grad_prev, dA.unbind(0), K_i.unbind(0), K_f.unbind(0), K_g.unbind(0), K_o.unbind(0),
                     K_c.unbind(0), F.unbind(0)))
    matmul = StepMatmul(W, B, T, dtype_W)
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
    grad_W = mm_t(flat, Hs[:-1].reshape(T * B, H), flat_low, dtype_W) if needs[5] else None
    return dA, flat_low, (delta if needs[1] else None), (gamma if needs[2] else None), grad_W
