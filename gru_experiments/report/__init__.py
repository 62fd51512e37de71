"""The report layer: a sweep folder read back and written up.

Owns: reading a sweep folder (`sweep_folder.py`), report.md and results.csv (`report.py`), the
plots (`plots.py`), the training x inference grid (`training_grid.py`), the findings
(`findings.py`, on the `finding.py` record) and the W&B summary run (`wandb_summary.py`); and the
sections of three records of summary.json, each a table, a figure and (but the classes) findings:
the generated text (`text_report.py`, `text_findings.py`), the planted-recall control
(`recall_report.py`, `recall_findings.py`) and the context curve by class (`context_classes.py`).

May import: runs/ (run folders, history), the study (figure names) and the ground floor; only
sweep.py and the API stand above it. A new plot goes in `plots.py`, a new finding in
`findings.py` (or the module of its record).
"""
