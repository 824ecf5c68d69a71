"""Tokenizer loading, backends, special tokens and every tokenizer kind through the engine."""
