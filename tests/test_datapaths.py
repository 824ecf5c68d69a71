"""The data-path registry is the one list every layer reads: the loaders, the config check, the benchmarks, the
analysis and the study agree with it, and none of them imports torch to know it."""

from __future__ import annotations

import subprocess
import sys

from pretok_lib import datapaths
from pretok_lib.datapaths import FORMAT_OF, KINDS, ON_THE_FLY, PACKED, PRETOK_PAIRS, PRETOKENIZED


def test_registry_facts() -> None:
    assert KINDS == ("padded", "padding-free", "pretok-padded", "pretok-token-list", "pretok-memmap")
    assert set(ON_THE_FLY) | set(PRETOKENIZED) == set(KINDS) and not set(ON_THE_FLY) & set(PRETOKENIZED)
    assert set(FORMAT_OF) == set(PRETOKENIZED) and set(FORMAT_OF.values()) == {"padded", "token-list", "memmap"}
    for kind, base in PRETOK_PAIRS.items():  # a pretokenized path is compared with the baseline of its layout
        assert base in ON_THE_FLY and (kind in PACKED) == (base in PACKED)
    assert sorted(["pretok-memmap", "x", "padded"], key=datapaths.rank) == ["padded", "pretok-memmap", "x"]
    assert datapaths.global_batch(8, 2, 4) == 64 and datapaths.window(1024) == 1025


def test_every_layer_reads_the_registry() -> None:
    import pretok_lib.data as data
    from pretok_lib.analysis import stall
    from pretok_lib.bench import loaders
    from pretok_lib.study import profiles, steps

    assert data.KINDS is KINDS and stall.PATHS == KINDS and list(profiles.PATHS) == list(KINDS)
    assert loaders.FORMAT_OF is FORMAT_OF and set(steps.KIND_OF.values()) == set(PRETOKENIZED)
    assert set(steps.data_paths("c.parquet", {"memmap": "m", "token-list-zstd3": "t", "padded-zstd3": "p"})) == set(KINDS)


def test_registry_is_torch_free() -> None:
    code = "import sys, pretok_lib.datapaths, pretok_lib.run_record, pretok_lib.analysis.runs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
