"""The data layer: text in, token ids and batches out; it knows nothing of the models (pyproject's layers). A new
tokenizer goes in `tokenizers.py` and conf/tokenizer/."""
