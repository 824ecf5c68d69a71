"""metrics.py's reader on a log that is being written, was cut by a kill or is damaged: every reader of a
metrics.jsonl in the trainer (resume), gpu-check, gpu-study and the tests that poll a live run goes through
`read_records`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.train.metrics import MetricsLog, read_records

_numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False))
_record = st.fixed_dictionaries({"kind": st.sampled_from(["train", "val"]), "step": st.integers(0, 10**5)},
                                optional={"loss": _numbers, "lr": _numbers, "note": st.text(max_size=20)})


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, min_size=1, max_size=6), st.data())
def test_a_log_cut_at_any_byte_reads_as_its_complete_records(tmp_path_factory, recs, data):
    raw = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    path.write_bytes(raw[:cut])
    ends, at = [], 0
    for r in recs:   # a record counts once its JSON is whole, with or without its newline
        at += len(json.dumps(r, ensure_ascii=False).encode())
        ends.append(at)
        at += 1
    whole = [r for r, end in zip(recs, ends) if end <= cut]
    assert read_records(path) == whole
    assert read_records(path, "val") == [r for r in whole if r["kind"] == "val"]


# what else a damaged log may hold where a record was: JSON that is not a record, bytes that are not JSON or UTF-8
_damage = st.one_of(
    st.sampled_from([b"", b"\x00" * 12, b"\xff\xfe{", b'{"kind": "train"}', b'{"step": -1}', b'{"step": true}',
                     b'{"step": 1.5}', b"[1, 2]", b"3", b"null", b'"step"', b"[" * 5000]),
    st.binary(max_size=40),
    st.dictionaries(st.text(max_size=5).filter(lambda k: k != "step"), st.integers(), max_size=3)
    .map(lambda d: json.dumps(d).encode()))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(_record.map(lambda r: ("ok", r)), _damage.map(lambda b: ("bad", b))), max_size=8))
def test_damaged_lines_are_left_out_and_the_records_kept(tmp_path_factory, lines):
    """Never raises; returns the records in order. A resumed run keeps them (up to its checkpoint) and drops the
    rest, so its log is clean again."""
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    path.write_bytes(b"".join((json.dumps(x).encode() if kind == "ok" else x.replace(b"\n", b" ")) + b"\n"
                              for kind, x in lines))
    want = [x for kind, x in lines if kind == "ok"]
    got = read_records(path)
    assert got == want
    MetricsLog(path.parent, resume_step=50_000, tensorboard=False).close()
    assert read_records(path) == [r for r in got if r["step"] <= 50_000]
    assert all(json.loads(line) in got for line in path.read_text().splitlines())


def test_a_reader_polling_a_live_log_only_ever_sees_a_growing_prefix(tmp_path):
    """A writer appends long records (several writes each, as a full buffer splits them) while this process reads."""
    path, n = tmp_path / "metrics.jsonl", 1000
    writer = textwrap.dedent(f"""
        import json
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
