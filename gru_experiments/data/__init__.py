"""The data layer: text in, token ids and batches out.

Owns: the corpus (where it comes from, the shipped Tiny Shakespeare in `corpora/`, the split:
`corpus.py`), the tokenizers (char and SentencePiece: `tokenizers.py`) and how training and
validation batches are drawn (random windows, contiguous streams for truncated BPTT, the
Lightning data module: `batches.py`), and the planted-recall probe (pairs planted in the splits,
the training split afresh every pass: `recall_probe.py`).

May import: torch, Lightning, SentencePiece and the ground floor; never the models (the two layers
know nothing of each other). A new tokenizer goes in `tokenizers.py` and conf/tokenizer/.
"""
