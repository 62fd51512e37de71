"""The data layer: text in, token ids and batches out (the corpus, the tokenizers, the batches, the recall probe).

May import: torch, Lightning, SentencePiece and the ground floor; never the models (the two layers know nothing
of each other). A new tokenizer goes in `tokenizers.py` and conf/tokenizer/.
"""
