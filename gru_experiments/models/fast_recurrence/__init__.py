"""Fast paths for the layers in `models/cells.py`: the same formulas, fewer and bigger ops.

`gru_sequence`, `lstm_sequence` and `rnn_sequence` run one layer over a whole sequence, each a custom
`torch.autograd.Function` with a hand-derived backward (no double backward), optionally with bf16
matmul inputs. The design, the backward equations and the measurements: docs/performance.md;
tests/test_fast_recurrence.py holds them to the readable `step` within 1e-5 in float32.
"""


from gru_experiments.models.fast_recurrence.gru import gru_sequence
from gru_experiments.models.fast_recurrence.lstm import lstm_sequence
from gru_experiments.models.fast_recurrence.rnn import rnn_sequence

__all__ = ["gru_sequence", "lstm_sequence", "rnn_sequence"]
