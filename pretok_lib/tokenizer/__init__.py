"""Load any tokenizer, fingerprint it, pick the fastest backend that gives the reference's exact ids, encode to numpy.

- `files.py`: what a tokenizer is (`load_tokenizer`, `identify` -> `TokenizerInfo`: kind, fingerprint, vocab,
  special ids), read from tokenizer.json, a SentencePiece .model, a .tiktoken, a tekken JSON or transformers;
- `specials.py`: where BOS/EOS/PAD are found (`resolve`: ordered sources, the first declaring a role wins);
- `backends.py`: its candidate backends, fastest first (`backends_for`), each built by `make_encoder` as an
  `Encoder` that never adds special tokens and reads special strings in text as ordinary text;
- `select.py`: `select_backend`, the first candidate whose ids equal the reference's on samples and probes.
"""

from __future__ import annotations

from .backends import (_BUILDERS, CANDIDATES, BackendUnavailable, Encoder, _flatten, _reason, _source, backends_for,
                       build_first, fastokens_encoder, id_dtype_for, limit_threads_to_one_cpu, make_encoder,
                       unbuildable)
from .files import (TIKTOKEN_STEMS, TokenizerInfo, _parse_json, _parse_tiktoken, _tekken_parts, _tiktoken_constants,
                    identify, load_tokenizer)
from .select import BackendChoice, _mismatch, probe_texts, select_backend

__all__ = ["CANDIDATES", "TIKTOKEN_STEMS", "BackendChoice", "BackendUnavailable", "Encoder", "TokenizerInfo",
           "backends_for", "build_first", "fastokens_encoder", "id_dtype_for", "identify", "limit_threads_to_one_cpu",
           "load_tokenizer", "make_encoder", "probe_texts", "select_backend", "unbuildable",
           # used by train/hf_tokenizer.py, which rebuilds the same tokenizers for transformers
           "_BUILDERS", "_flatten", "_mismatch", "_parse_json", "_parse_tiktoken", "_reason", "_source", "_tekken_parts",
           "_tiktoken_constants"]
