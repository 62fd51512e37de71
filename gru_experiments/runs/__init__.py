"""The run layer: one training or sampling job, from a composed config to its run folder (training, its
Lightning module, the config checks, checkpoints and resume, the run folder, loggers, failures, DDP in multiruns).

May import: the study, the data, the models and the ground floor; never report/ or the API.
`jobs` and `run_dir` stay light (no torch at import): the scripts import them first.
"""
