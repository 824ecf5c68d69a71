from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import study


@pytest.fixture(scope="session")
def study_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic study of 15 runs (see helpers.study); read-only for the tests."""
    return study(tmp_path_factory.mktemp("study") / "runs")


@pytest.fixture(scope="session")
def bench() -> dict:
    """A `pretok bench tokenize --json` result reduced to what the analysis reads (same schema)."""
    m = lambda mb_s: {"mb_per_s": mb_s, "tokens_per_s": mb_s * 450_000.0, "seconds": 1.0}  # noqa: E731
    return {"methods": {"(d) engine memmap w1": m(80.0), "(d) engine memmap w2": m(88.0),
                        "(d) engine token-list w2": m(86.0), "(d) engine padded w2": m(94.0),
                        "(c) ceiling 1 core": m(300.0), "(a) per-doc tok(text) loop": m(2.0),
                        "(b) datasets.map": {**m(2.5), "disk_bytes": 5000, "stored_tokens": 1000,
                                             "documents": 10}}}
