"""The model layer: every language-model family behind one protocol (`protocol.py`), and bf16 matmuls.

May import: torch and the ground floor (`errors`, `files`, `validation`); nothing else of the project
(lint-imports checks it). A new family is one module here and one config in conf/model/.
"""
