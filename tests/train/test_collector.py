"""The garbage collector in training: off while the loop runs, collections only at the scheduled steps (young
ones every train.gc_every steps, full ones where all ranks pause), restored after; and `python -m
pretok_lib.train` imports torch and transformers with no collection pass over them."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from pretok_lib.train import collector, load_config, train

from ..conftest import ROOT
from .conftest import tiny_overrides


@pytest.fixture
def collections():
    """The generations collected while the automatic collector is off (so: collections asked for)."""
    seen: list[int] = []

    def note(phase, info):
        if phase == "start" and not gc.isenabled():
            seen.append(info["generation"])

    gc.callbacks.append(note)
    yield seen
    gc.callbacks.remove(note)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_scheduled_collections_and_the_state_restored(collections, enabled_before):
    was = gc.isenabled()
    (gc.enable if enabled_before else gc.disable)()
    try:
        with collector.scheduled(3) as after_step:
            assert not gc.isenabled()
            for step in range(1, 8):
                after_step(step, pause=step == 5)
        assert collections == [1, 2, 1]          # steps 3 and 6 young, the pause at 5 full
        assert gc.isenabled() is enabled_before
        with pytest.raises(RuntimeError), collector.scheduled(2):
            raise RuntimeError("a failing step")
        assert gc.isenabled() is enabled_before
    finally:
        (gc.enable if was else gc.disable)()


def test_zero_leaves_the_automatic_collector(monkeypatch):
    asked: list = []
    monkeypatch.setattr(gc, "collect", lambda *a: asked.append(a))
    with collector.scheduled(0) as after_step:
        assert gc.isenabled()
        for step in range(1, 5):
            after_step(step, pause=True)
    assert gc.isenabled() and asked == []


def test_a_run_collects_only_where_scheduled(train_data, tmp_path, collections):
    assert gc.isenabled()
    cfg = load_config(None, tiny_overrides(train_data, tmp_path, **{"train.steps": 7, "train.gc_every": 2,
                                                                    "eval.every": 100, "checkpoint.export": False}))
    assert train(cfg) == 0
    assert gc.isenabled()
    # young collections after steps 2, 4 and 6; the last step saves and ends the loop (no collection after it)
    assert collections == [1, 1, 1]


PROBE = r"""
import gc, runpy, sys
late = []
gc.callbacks.append(lambda phase, info: late.append(1) if phase == "start" and "torch" in sys.modules
                    and gc.get_freeze_count() == 0 else None)
sys.argv = ["pretok_lib.train", "--help"]
try:
    runpy.run_module("pretok_lib.train", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print(len(late), gc.get_freeze_count(), gc.isenabled(), "transformers" in sys.modules)
"""


def test_the_entry_point_imports_torch_and_transformers_without_collecting():
    assert "torch" not in subprocess.run([sys.executable, "-c", "import sys, pretok_lib.train; print(*sys.modules)"],
                                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    late, frozen, enabled, transformers = out.split()[-4:]
    assert (late, enabled, transformers) == ("0", "True", "True") and int(frozen) > 100_000
