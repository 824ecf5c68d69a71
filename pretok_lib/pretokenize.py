"""The tokenize engine's Python API: what `pretok tokenize`, `merge`, `inspect` and `verify` call.

    from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
    manifest = run_tokenize(TokenizeConfig(inputs=["corpus.parquet"], out="data/web", tokenizer="tokenizer.json"))

The engine itself is the package `pretok_lib.engine` (docs/ENGINE.md); this module is its front door.
"""

from __future__ import annotations

from .engine.config import FORMATS, TokenizeConfig
from .engine.merge import merge_shards
from .engine.run import run_tokenize
from .engine.verify import format_inspect, inspect, verify

__all__ = ["FORMATS", "TokenizeConfig", "run_tokenize", "merge_shards", "inspect", "format_inspect", "verify"]
