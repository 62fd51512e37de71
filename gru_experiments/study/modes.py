"""The inference modes' names, the one home of them (docs/evaluation.md#the-inference-modes): every module that
names a mode (a figure, a summary key, a table's column, `sample.py inference=`) imports it from here.
"""

STATEFUL = "stateful"  # the state carried from token to token: every token before the prediction
WINDOWED = "windowed"  # the last `window` tokens re-run from the initial state at every prediction
STATELESS = "stateless"  # the last token alone, from the initial state: the original study's sampling
DYNAMIC = "dynamic"  # stateful, the weights adapted by their gradient as the text is read (Krause et al. 2018)

MODES = (STATEFUL, STATELESS, WINDOWED)  # the three every model is scored and sampled in, summary.json's order
MODES_BY_CONTEXT = (STATEFUL, WINDOWED, STATELESS)  # most context first: the order tables and figures compare them in
OVER_TRAINING_MODES = (STATEFUL, STATELESS)  # followed at every validation: the state carried and the state reset
