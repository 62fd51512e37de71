"""The report layer: a sweep folder read back and written up.

Owns: reading a sweep folder, each job upgraded once to today's summary (`sweep_folder.py`);
report.md, results.csv and the list of sections they walk (`report.py`, `report.SECTIONS`); the
shape of a section, its findings and the record it reads (`section.py`); the helpers every section
writes with: tables, ±, durations, figures (`common.py`); the W&B summary run (`wandb_summary.py`).
The sections: the study's figures (`plots.py`: ladder, context curve, modes over training, bpc by
mode, learning curves), the learning-rate sweep (`lr_sweep.py`), the training x inference grid
(`training_grid.py`), the study's findings (`findings.py`), the context curve by class
(`context_classes.py`), the planted-recall control and its findings (`recall_report.py`; its memory
horizon and cost, `recall_horizon.py`) and the generated text and its findings (`text_report.py`).

May import: runs/ (run folders, history), the study (figure names) and the ground floor; only
sweep.py and the API stand above it. A new section is a `Section` registered in `report.SECTIONS`
(docs/outputs.md, "How to add a report section").
"""
