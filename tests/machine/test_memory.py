"""memory.peak_rss_mb: this process's VmHWM, the one reader the engine, training and benchmarks share."""

from __future__ import annotations

import builtins
import resource
import subprocess
import sys

import pytest

from pretok_lib.machine.memory import peak_rss_mb

from ..conftest import ROOT


def test_peak_rss_is_vmhwm_and_grows_with_an_allocation():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    assert abs(peak_rss_mb() - int(status["VmHWM"].split()[0]) / 1024) < 64  # the same counter (moments apart)
    code = ("from pretok_lib.machine.memory import peak_rss_mb; a = peak_rss_mb(); b = bytearray(200 << 20); "
            "b[::4096] = b'x' * len(b[::4096]); print(a, peak_rss_mb())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    before, after = map(float, out.stdout.split())
    assert after - before > 150  # 200 MB touched: the peak rose by about that much


def test_without_proc_it_falls_back_to_ru_maxrss(monkeypatch):
    real_open = builtins.open

    def no_proc(path, *a, **kw):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert peak_rss_mb() == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# A document is encoded whole (documents are never split: ids must equal the reference tokenizer's), so a
# worker holds it several times over: its text (1-4 bytes a character in Python), the UTF-8 copy the encoder
# reads, the ids and the encoder's own buffers. Measured 6.6x (txt) and 7.4x (JSONL) the document's bytes with
# GPT-2 (fastokens) at 10-40 MB; docs/ENGINE.md states 8x plus the worker's start-up as the bound.
DOC_FACTOR, SLACK_MB = 8.5, 48


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_worker_memory_of_one_huge_document_is_bounded_by_its_size(tmp_path, kind):
    """One 24 MB document: the worker's peak RSS (the manifest's, VmHWM) rises over a run of a tiny document by
    at most DOC_FACTOR x its size (+ slack): a bound per document size, not one whole unit or input buffered."""
    import json

    from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

    from ..conftest import GPT2_JSON, WIKI_EN

    words = " ".join(v["extract"] for v in json.loads(WIKI_EN.read_text()).values())
    size = 24_000_000
    peaks = {}
    for name, text in (("tiny", "a short document"), ("huge", (words * (size // len(words) + 1))[:size])):
        path = tmp_path / f"{name}.{kind}"
        path.write_text(json.dumps({"text": text}) + "\n" if kind == "jsonl" else text)
        m = run_tokenize(TokenizeConfig(inputs=[str(path)], out=str(tmp_path / f"out-{name}"), tokenizer=str(GPT2_JSON),
                                        format="memmap", workers=1, progress=False))
        peaks[name] = m["run"]["worker_peak_rss_mb"]
    doc_mb = len(text.encode()) / 2**20
    assert peaks["huge"] - peaks["tiny"] <= DOC_FACTOR * doc_mb + SLACK_MB, (peaks, doc_mb)
