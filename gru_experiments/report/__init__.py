"""The report layer: a sweep folder read back (`sweep_folder.py`) and written up as report.md, results.csv
and PNGs (`report.py`, which walks the list of sections, `report.SECTIONS`; a section's shape: `section.py`;
their shared helpers: `common.py`) and a W&B summary run (`report.py` too). Each other module is a
section. May import runs/, the study and the ground floor; only sweep.py and the API stand above it.
"""
