"""The embedded default: the corpus and tokenizer built from what the install provides, and `make demo`."""
