"""On-disk token formats written and read by pretok."""
