"""The project's exceptions.

The library raises `UserError` (or a subclass) for anything caused by the input rather than
by a bug: a bad config value, a missing or unreadable corpus, an unusable checkpoint. Its
message says what is wrong and what to do. Scripts turn it into one line on stderr and exit
status 2 (gru_experiments/runs/jobs.py); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; the message says what to do about it."""


class TrainingDiverged(UserError):
    """The loss or the weights became non-finite; the last good checkpoint is kept."""


class NoResultsError(UserError):
    """A sweep folder holds no finished job to report on."""
