"""Fast paths for the layers in `models/cells.py`: the same formulas, fewer and bigger ops.

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
(`models/cells.py`, `step`) within 1e-5 in float32, and the bf16 path within a stated tolerance.
Double backward is not supported (`once_differentiable`).
"""


from gru_experiments.models.fast_recurrence.gru import gru_sequence
from gru_experiments.models.fast_recurrence.lstm import lstm_sequence
from gru_experiments.models.fast_recurrence.rnn import rnn_sequence

__all__ = ["gru_sequence", "lstm_sequence", "rnn_sequence"]
