"""pretok: pretokenize LLM corpora once, load them cheaply in DDP training, measure the data path."""

__version__ = "0.1.0"
