"""The run layer: one training or sampling job, from a composed config to its run folder.

Owns: training (`training.py`) and its Lightning module (`task.py`), the config checks
(`checks.py`), checkpoints and resume (`checkpoints.py`, `resume.py`), the run folder's layout
(`run_dir.py`), loggers and history.csv (`loggers.py`, `history.py`), failure handling for every
job (`jobs.py`), DDP inside multiruns (`distributed.py`), the smoke run and the cost estimate
(`smoke.py`, `estimate.py`) and sample.py's command (`sampling.py`).

May import: the study, the data, the models and the ground floor; never report/ or the API.
`jobs` and `run_dir` stay light (no torch at import): the scripts import them first.
"""
