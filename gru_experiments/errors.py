"""The project's exceptions: a `UserError` for anything the input caused, its message saying what to do (scripts
print it as one line, exit status 2: runs/jobs.py); any other exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what to do about it."""


class RunFolderTaken(UserError):
    """The run folder holds another run, or another process trains in it: the refusal leaves it as it was (no
    failure record written into it, nothing removed)."""


class TrainingDiverged(UserError):
    """The loss or the weights became non-finite; the last good checkpoint is kept."""


class NoResultsError(UserError):
    """A sweep folder holds no finished job to report on."""
