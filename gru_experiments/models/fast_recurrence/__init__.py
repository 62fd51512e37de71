"""Fast paths for the layers in `models/cells.py`: the same formulas, fewer and bigger ops, each layer's sequence
one autograd Function with a hand-derived backward. The design, the equations, the measurements and the tests:
docs/performance.md."""


from gru_experiments.models.fast_recurrence.gru import gru_sequence
from gru_experiments.models.fast_recurrence.lstm import lstm_sequence
from gru_experiments.models.fast_recurrence.rnn import rnn_sequence

__all__ = ["gru_sequence", "lstm_sequence", "rnn_sequence"]
