"""metrics.py's reader on a log that is being written or was cut by a kill: every reader of metrics.jsonl while a
run writes it (the resume and SLURM tests, gpu-check, gpu-study) goes through `read_records`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.train.metrics import read_records

_numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False))
_record = st.fixed_dictionaries({"kind": st.sampled_from(["train", "val"]), "step": st.integers(0, 10**5)},
                                optional={"loss": _numbers, "lr": _numbers, "note": st.text(max_size=20)})


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, min_size=1, max_size=6), st.data())
def test_a_log_cut_at_any_byte_reads_as_its_complete_records(tmp_path_factory, recs, data):
    text = "".join(json.dumps(r) + "\n" for r in recs)
    raw = text.encode()
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    path.write_bytes(raw[:cut])
    ends, at = [], 0
    for r in recs:   # a record counts once its JSON is whole, with or without its newline
        at += len(json.dumps(r).encode())
        ends.append(at)
        at += 1
    whole = [r for r, end in zip(recs, ends) if end <= cut]
    try:
        raw[:cut].decode()
    except UnicodeDecodeError:   # a cut inside a multi-byte character: the file is not text yet
        return
    got = read_records(path)
    assert got == whole
    assert read_records(path, "val") == [r for r in whole if r["kind"] == "val"]


def test_a_reader_polling_a_live_log_only_ever_sees_a_growing_prefix(tmp_path):
    """A writer appends long records (several writes each, as a full buffer splits them) while this process reads."""
    path, n = tmp_path / "metrics.jsonl", 1000
    writer = textwrap.dedent(f"""
        import json, sys
        with open({str(path)!r}, "a", buffering=64) as fh:
            for i in range({n}):
                fh.write(json.dumps({{"kind": "train", "step": i, "pad": "x" * 500}}) + "\\n")
                fh.flush()
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    seen, reads = 0, 0
    while proc.poll() is None or reads == 0:
        got = read_records(path, "train")
        assert [r["step"] for r in got] == list(range(len(got)))
        assert len(got) >= seen
        seen, reads = len(got), reads + 1
    assert proc.wait() == 0
    assert [r["step"] for r in read_records(path, "train")] == list(range(n))
