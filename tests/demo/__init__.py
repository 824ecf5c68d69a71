"""The embedded default corpus and `pretok demo`."""
