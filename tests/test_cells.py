"""The cells are the study's formulas: checked against independent code and against PyTorch."""

import pytest
import torch
from torch import nn

from gru_experiments.models.cells import GRULayer, LSTMLayer, RNNLayer

torch.manual_seed(0)


def independent_gru(x, h, layer: GRULayer):
    """The study's GRU written out per sample with separate named matrices (no chunking, no batching)."""
    H = layer.hidden_size
    Wx, bx = layer.input_weight, layer.input_bias
    Wh_rz, b_rz, Wh = layer.hidden_weight_rz, layer.hidden_bias_rz, layer.hidden_weight_candidate
    W_rx, W_zx, W_x = Wx[:H], Wx[H:2 * H], Wx[2 * H:]
    b_rx, b_zx, b_x = bx[:H], bx[H:2 * H], bx[2 * H:]
    W_rh, W_zh, b_r, b_z = Wh_rz[:H], Wh_rz[H:], b_rz[:H], b_rz[H:]
    outputs = []
    for t in range(x.shape[1]):
        rows = []
        for b in range(x.shape[0]):
            xb, hb = x[b, t], h[b]
            r = torch.sigmoid(torch.mv(W_rx, xb) + b_rx + torch.mv(W_rh, hb) + b_r)
            z = torch.sigmoid(torch.mv(W_zx, xb) + b_zx + torch.mv(W_zh, hb) + b_z)
            cand = torch.tanh(torch.mv(W_x, xb) + b_x + torch.mv(Wh, r * hb))
            rows.append((1 - z) * hb + z * cand)
        h = torch.stack(rows)
        outputs.append(h)
    return torch.stack(outputs, 1), h


def independent_lstm(x, state, layer: LSTMLayer):
    H = layer.hidden_size
    h, c = state
    W, b, U = layer.input_weight, layer.input_bias, layer.hidden_weight
    outputs = []
    for t in range(x.shape[1]):
        pre = [torch.einsum("hi,bi->bh", W[k * H:(k + 1) * H], x[:, t]) + b[k * H:(k + 1) * H]
               + torch.einsum("hj,bj->bh", U[k * H:(k + 1) * H], h) for k in range(4)]
        i, f, o = torch.sigmoid(pre[0]), torch.sigmoid(pre[1]), torch.sigmoid(pre[3])
        g = torch.tanh(pre[2])
        c = f * c + i * g
        h = o * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, 1), (h, c)


def grads(outputs, params):
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outputs)
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("implementation", ["reference", "fast"])
def test_gru_matches_independent_formula(implementation):
    layer = GRULayer(5, 7, implementation).double()
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    h0 = torch.randn(3, 7, dtype=torch.float64)
    y, h = layer(x, h0)
    y_ref, h_ref = independent_gru(x, h0, layer)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    params = list(layer.parameters())
    for g, g_ref in zip(grads([y], params), grads([y_ref], params)):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("implementation", ["reference", "fast"])
def test_lstm_matches_independent_formula(implementation):
    layer = LSTMLayer(5, 7, implementation).double()
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    state = (torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64))
    y, (h, c) = layer(x, state)
    y_ref, (h_ref, c_ref) = independent_lstm(x, state, layer)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(c, c_ref)
    params = list(layer.parameters())
    for g, g_ref in zip(grads([y, c], params), grads([y_ref, c_ref], params)):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("cls", [GRULayer, LSTMLayer])
def test_gradcheck_float64(cls):
    layer = cls(3, 4, "reference").double()
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    state = h0 if cls is GRULayer else (h0, torch.zeros_like(h0))
    assert torch.autograd.gradcheck(lambda x, h0, *p: layer(x, state if cls is LSTMLayer else h0)[0],
                                    (x, h0, *layer.parameters()))


def torch_gru_with_our_weights(layer: GRULayer) -> nn.GRU:
    """nn.GRU loaded with our weights so that everything but the reset placement agrees.

    PyTorch: n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h
    Ours:    h̃ = tanh(W_x x + b_x + W_h (r ⊙ h)),            h' = (1 − z) ⊙ h + z ⊙ h̃
    Negating the z weights swaps the roles of z and 1 − z; b_hn = 0.
    """
    H, I = layer.hidden_size, layer.input_size
    gru = nn.GRU(I, H, batch_first=True).double()
    W_rx, W_zx, W_x = layer.input_weight.detach().chunk(3)
    b_rx, b_zx, b_x = layer.input_bias.detach().chunk(3)
    W_rh, W_zh = layer.hidden_weight_rz.detach().chunk(2)
    b_r, b_z = layer.hidden_bias_rz.detach().chunk(2)
    with torch.no_grad():
        gru.weight_ih_l0.copy_(torch.cat([W_rx, -W_zx, W_x]))
        gru.bias_ih_l0.copy_(torch.cat([b_rx, -b_zx, b_x]))
        gru.weight_hh_l0.copy_(torch.cat([W_rh, -W_zh, layer.hidden_weight_candidate.detach()]))
        gru.bias_hh_l0.copy_(torch.cat([b_r, -b_z, torch.zeros(H, dtype=b_r.dtype)]))
    return gru


def test_our_gru_is_not_pytorchs_reset_after_gru():
    layer = GRULayer(4, 6, "reference").double()
    x = torch.randn(2, 10, 4, dtype=torch.float64)
    h0 = torch.randn(2, 6, dtype=torch.float64)
    ours, _ = layer(x, h0)
    theirs, _ = torch_gru_with_our_weights(layer)(x, h0.unsqueeze(0))

    # The mapping is right: PyTorch's reset-after candidate, computed by hand on our weights, agrees with nn.GRU...
    W_rh, W_zh = layer.hidden_weight_rz.chunk(2)
    b_r, b_z = layer.hidden_bias_rz.chunk(2)
    W_rx, W_zx, W_x = layer.input_weight.chunk(3)
    b_rx, b_zx, b_x = layer.input_bias.chunk(3)
    h, reset_after = h0, []
    for x_t in x.unbind(1):
        r = torch.sigmoid(x_t @ W_rx.T + b_rx + h @ W_rh.T + b_r)
        z = torch.sigmoid(x_t @ W_zx.T + b_zx + h @ W_zh.T + b_z)
        h = (1 - z) * h + z * torch.tanh(x_t @ W_x.T + b_x + r * (h @ layer.hidden_weight_candidate.T))
        reset_after.append(h)
    torch.testing.assert_close(torch.stack(reset_after, 1).detach(), theirs.detach())
    # ...and the only difference, where r is applied, changes the outputs.
    assert (ours - theirs).abs().max() > 1e-3


def test_our_lstm_equals_pytorchs_lstm_with_zero_hidden_bias():
    layer = LSTMLayer(4, 6, "reference").double()
    lstm = nn.LSTM(4, 6, batch_first=True).double()
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(layer.input_weight)
        lstm.bias_ih_l0.copy_(layer.input_bias)
        lstm.weight_hh_l0.copy_(layer.hidden_weight)
        lstm.bias_hh_l0.zero_()
    x = torch.randn(2, 10, 4, dtype=torch.float64)
    h0, c0 = torch.randn(2, 6, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64)
    ours, (h, c) = layer(x, (h0, c0))
    theirs, (h_t, c_t) = lstm(x, (h0[None], c0[None]))
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(c, c_t[0])


@pytest.mark.parametrize("implementation", ["reference", "fast"])
def test_rnn_equals_pytorchs_rnn_with_zero_hidden_bias(implementation):
    """The Elman RNN h' = tanh(W_x x + b + W_h h) against nn.RNN (tanh), outputs and every gradient."""
    layer = RNNLayer(4, 6, implementation).double()
    rnn = nn.RNN(4, 6, batch_first=True).double()
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(layer.input_weight)
        rnn.bias_ih_l0.copy_(layer.input_bias)
        rnn.weight_hh_l0.copy_(layer.hidden_weight)
        rnn.bias_hh_l0.zero_()
    x = torch.randn(2, 10, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    ours, h = layer(x, h0)
    theirs, h_t = rnn(x, h0[None])
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(h, h_t[0])
    ours_grads = grads([ours], [x, h0, layer.input_weight, layer.input_bias, layer.hidden_weight])
    theirs_grads = grads([theirs], [x, h0, rnn.weight_ih_l0, rnn.bias_ih_l0, rnn.weight_hh_l0])
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cls", [GRULayer, LSTMLayer, RNNLayer])
def test_step_continues_a_sequence(cls):
    """forward over T steps == forward over the first part, then the rest from the carried state."""
    layer = cls(3, 5)
    x = torch.randn(2, 9, 3)
    y_full, state_full = layer(x)
    y_a, state = layer(x[:, :4])
    y_b, state = layer(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([y_a, y_b], 1), y_full)
    y_t, _ = layer.step(x[:, 0], layer.initial_state(2))
    torch.testing.assert_close(y_t, y_full[:, 0])


def test_forget_bias_opens_the_lstm_forget_gate_and_zero_changes_nothing():
    """architecture.forget_bias (Jozefowicz et al. 2015): b_f starts 1 higher, every other weight as without it;
    the default, 0, is the model every LSTM figure so far was trained with."""
    from gru_experiments.errors import UserError
    from gru_experiments.models.recurrent import RecurrentLM

    def built(**kwargs):
        torch.manual_seed(0)
        return RecurrentLM(65, "lstm", 8, 16, num_layers=2, **kwargs)

    plain, zero, opened = built(), built(forget_bias=0), built(forget_bias=1)
    H = 16
    for p, z, o in zip(plain.state_dict().items(), zero.state_dict().values(), opened.state_dict().values()):
        name, p = p
        assert torch.equal(p, z)
        if name.endswith("input_bias"):
            assert torch.allclose(o[H:2 * H] - p[H:2 * H], torch.ones(H)) and torch.equal(o[:H], p[:H])
            assert torch.equal(o[2 * H:], p[2 * H:])
        else:
            assert torch.equal(o, p)
    with pytest.raises(UserError, match="forget_bias"):
        RecurrentLM(65, "gru", 8, 16, forget_bias=1)
