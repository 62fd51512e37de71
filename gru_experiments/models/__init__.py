"""The model layer: every language-model family behind one protocol.

Owns: the protocol and how a family is built from its config (`protocol.py`), the hand-written
recurrent cells (`cells.py`) and their fast paths (`fast_recurrence/`), the stacked recurrent model
of every GRU, LSTM and RNN config (`recurrent.py`), minGRU and minLSTM (`minrnn.py`), Bengio's MLP
(`mlp.py`), the counted n-gram (`ngram.py`) and bf16 matmul precision (`precision.py`).

May import: torch and the ground floor (`gru_experiments.errors`, `files`, `validation`); nothing
else of the project (lint-imports checks it: pyproject.toml [tool.importlinter]). A new family is
one module here and one config in conf/model/.
"""
