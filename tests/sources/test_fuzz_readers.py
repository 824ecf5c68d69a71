"""Fuzzing the input readers: generated JSONL / text / parquet inputs (plain, .gz, .zst), intact or damaged
(truncation, byte flips, invalid UTF-8, lone surrogates, wrong keys, odd column types, empty and huge documents).

The property, for every case: either every intact document comes out exactly once, in order, and every damaged
one is counted under its kind; or the outcome is one `PretokError` line. Never another exception, never a hang
(per-case alarm; per-case subprocess timeout end to end), never a manifest over missing data. Most cases run
in-process against the reader API; a few run end to end through the CLI. `CASES` counts cases run per class
(printed at the end of the module with `-s`, for the README table).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit
from pretok_lib.sources.input_checks import SAMPLE_LINES, check_skipped

from ..conftest import GPT2_JSON, ROOT, one_line

CASES: Counter = Counter()  # (input class, outcome) -> cases run; every case run passed, or the test failed
FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufeff\n\r"), min_size=1,
               max_size=30) | st.sampled_from(["x" * 70_000, "é" * 40_000 + "末"])  # huge documents, now and then
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                          lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=3), v, max_size=3),
                          max_leaves=6)
WHERE = st.integers(0, 1000).map(lambda k: k / 1000)  # where a cut or a flipped bit lands, as a fraction
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe6\x97", b"\x80\x80", b"\xf4\x90\x80\x80"]


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nfuzz cases run (all passed):")
    for (cls, outcome), n in sorted(CASES.items()):
        print(f"  {cls:<28} {outcome:<10} {n}")
    if os.environ.get("PRETOK_FUZZ_REPORT"):
        Path(os.environ["PRETOK_FUZZ_REPORT"]).write_text(json.dumps({f"{c}|{o}": n for (c, o), n in CASES.items()}))


@contextmanager
def alarm(seconds: int = 20):
    def hang(*_):
        raise TimeoutError(f"reader hung for {seconds} s")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def read(paths: list[Path], **kw) -> tuple[list[str], Counter] | str:
    """(texts, skipped by kind) read through planning and every unit, with the end-of-run check (threshold 1),
    or the PretokError's one line. Any other exception fails the test."""
    opts = SourceOptions(**{"part_bytes": 2000, "batch_bytes": 700, **kw})
    texts, skipped = [], Counter()
    try:
        with alarm():
            for u in plan_units(expand_inputs([str(p) for p in paths]), opts):
                for b in read_unit(u, opts):
                    texts += b.texts
                    skipped.update(b.skipped)
            check_skipped(len(texts), skipped, 1.0)
    except PretokError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        return str(e)
    return texts, +skipped


# ---------------------------------------------------------------- JSONL


@st.composite
def jsonl_lines(draw) -> tuple[list[bytes], list[str], Counter]:
    """JSONL lines of intact and damaged records, with the documents and skip counts they must give."""
    lines, texts, skipped = [], [], Counter()
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["ok"] * 6 + ["null", "missing", "nonstring", "empty", "utf8", "surrogate",
                                                  "json", "blank", "nonobject"]))
        rec = draw(st.dictionaries(st.sampled_from(["id", "meta", "title"]), JSON_VALUE, max_size=2))
        if kind in ("ok", "utf8"):
            rec["text"] = draw(TEXT)
        elif kind != "missing":
            rec["text"] = {"null": None, "nonstring": draw(JSON_VALUE.filter(lambda v: v is not None and not
                                                                             isinstance(v, str))),
                           "empty": "", "surrogate": "a\ud800b", "json": "x", "blank": "x",
                           "nonobject": "x"}[kind]
        line = json.dumps(rec, ensure_ascii=kind == "surrogate" or draw(st.booleans())).encode()
        if kind == "utf8":  # raw invalid bytes inside the text's string
            i = line.index(b'"text": "') + 9
            line = line[:i] + draw(st.sampled_from(BAD_BYTES)) + line[i:]
        elif kind == "json":
            line = line[: draw(st.integers(0, len(line) - 2))] + b"\x00"
        elif kind == "blank":
            line = b"  "
        elif kind == "nonobject":  # valid JSON, not a record: an array, string, number or literal
            line = json.dumps(draw(JSON_VALUE.filter(lambda v: not isinstance(v, dict)))).encode()
        lines.append(line + b"\n")
        if kind == "ok":
            texts.append(rec["text"])
        elif kind != "blank":
            skipped[{"utf8": "invalid", "surrogate": "invalid", "json": "invalid", "nonobject": "invalid"}.get(kind, kind)] += 1
    return lines, texts, skipped


def reference_jsonl(data: bytes) -> tuple[list[str], Counter]:
    """The contract, applied to a whole plain JSONL file line by line."""
    texts, skipped = [], Counter()
    for i, line in enumerate(data.split(b"\n")):
        if i == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            skipped["invalid"] += 1
            continue
        if not isinstance(rec, dict):  # JSON, not a record: a damaged line
            skipped["invalid"] += 1
            continue
        t = rec.get("text", KeyError)
        kind = ("missing" if t is KeyError else "null" if t is None else "nonstring" if not isinstance(t, str)
                else "empty" if not t else "invalid" if any(0xD800 <= ord(c) < 0xE000 for c in t) else None)
        if kind:
            skipped[kind] += 1
        else:
            texts.append(t)
    return texts, +skipped


def shape_error_expected(data: bytes) -> bool:
    """Planning refuses a file whose first non-blank lines hold no record with the text key."""
    data = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    lines = [ln for ln in data.split(b"\n") if ln.strip()][:SAMPLE_LINES]
    for line in lines:
        try:
            rec = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and "text" in rec:
            return False
    return bool(lines)


def compress(raw: bytes, codec: str, frames: int) -> list[tuple[bytes, bytes]]:
    """raw as `frames` gzip members / zstd frames (zstd with content checksums): (compressed, raw) of each."""
    cuts = [len(raw) * i // frames for i in range(frames + 1)]
    pieces = [raw[a:b] for a, b in zip(cuts, cuts[1:])]
    if codec == "gz":
        return [(gzip.compress(p, mtime=0), p) for p in pieces]
    z = zstandard.ZstdCompressor(write_checksum=True)
    return [(z.compress(p), p) for p in pieces]


def whole_frames(file: bytes, frames: list[tuple[bytes, bytes]]) -> bytes | None:
    """The raw bytes of a truncated compressed file if it was cut exactly at a frame end (a valid file), else
    None."""
    size, raw = 0, b""
    for comp, piece in frames:
        if size == len(file):
            return raw
        size, raw = size + len(comp), raw + piece
    return raw if size == len(file) else None


@settings(FUZZ, max_examples=200)
@given(gen=jsonl_lines(), codec=st.sampled_from(["", "gz", "zst"]), frames=st.integers(1, 3),
       damage=st.sampled_from(["none", "truncate", "flip"]), where=WHERE, bit=st.integers(0, 7),
       bom=st.booleans())
def test_jsonl_intact_or_counted_or_one_line(tmp_path_factory, gen, codec, frames, damage, where, bit, bom):
    lines, texts, skipped = gen
    raw = (b"\xef\xbb\xbf" if bom else b"") + b"".join(lines)
    assert reference_jsonl(raw) == (texts, +skipped)  # the generator and the reference agree
    parts = compress(raw, codec, frames) if codec else [(raw, raw)]
    file = whole = b"".join(c for c, _ in parts)
    if damage == "truncate":
        file = file[: int(len(file) * where)]
    elif damage == "flip" and file:
        i = min(int(len(file) * where), len(file) - 1)
        file = file[:i] + bytes([file[i] ^ (1 << bit)]) + file[i + 1 :]
    damage = damage if file != whole else "none"
    path = tmp_path_factory.mktemp("j") / ("in.jsonl" + (f".{codec}" if codec else ""))
    path.write_bytes(file)
    got = read([path])
    cls = f"jsonl{'.' + codec if codec else ''} {damage}"
    cut = whole_frames(file, parts) if codec and damage == "truncate" else None
    if not codec or damage == "none" or cut is not None:  # the contract on the bytes as they are
        plain = file if not codec else raw if cut is None else cut
        want = reference_jsonl(plain)
        if shape_error_expected(plain) or not want[0]:
            assert isinstance(got, str), got
        else:
            assert got == want
    elif isinstance(got, tuple):  # damaged container read without error: only when the damage changed nothing
        assert damage == "flip" and got == (texts, +skipped), "damaged compressed file read as complete"
    CASES[(cls, "error" if isinstance(got, str) else "read")] += 1


# ---------------------------------------------------------------- text files


@settings(FUZZ, max_examples=100)
@given(docs=st.lists(st.tuples(TEXT, st.sampled_from([None] * 4 + BAD_BYTES), st.floats(0, 1)), min_size=1,
                     max_size=20),
       sep=st.sampled_from([r"\n\n+", None]), bom=st.booleans(), batch=st.sampled_from([16, 256, 4096]))
def test_text_damage_skips_only_its_document(tmp_path_factory, docs, sep, bom, batch):
    """One invalid byte loses only the document (paragraph, or file) holding it; a BOM is not text."""
    base = tmp_path_factory.mktemp("t")
    encoded = []
    for text, bad, where in docs:
        b = text.encode()
        i = int(len(b) * where)
        encoded.append(b if bad is None else b[:i] + bad + b[i:])
    want = [t for t, bad, _ in docs if bad is None]
    n_bad = sum(bad is not None for _, bad, _ in docs)
    if sep:
        paths = [base / "all.txt"]
        paths[0].write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"\n\n".join(encoded) + b"\n\n" * bom)
    else:
        paths = [base / f"{i:03d}.txt" for i in range(len(encoded))]
        for p, b in zip(paths, encoded):
            p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b)
    got = read(paths, separator=sep, batch_bytes=batch)
    if want:
        assert got == (want, Counter({"invalid": n_bad}) if n_bad else Counter())
    else:
        assert isinstance(got, str) and "no document" in got
    CASES[(f"txt {'separator' if sep else 'file per doc'}", "bad bytes" if n_bad else "intact")] += 1


# ---------------------------------------------------------------- parquet


TEXT_TYPES = {"string": pa.string(), "large_string": pa.large_string(), "string_view": pa.string_view(),
              "dictionary": pa.dictionary(pa.int32(), pa.string())}
ODD = {"int": pa.array([1]), "list": pa.array([["a"]]), "struct": pa.array([{"a": "b"}]),
       "binary": pa.array([b"a"]), "null": pa.array([None])}


def text_array(values: list, typ: str) -> pa.Array:
    """values (str, None or invalid bytes) as a string column of the given layout."""
    binary = pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())
    arr = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers(), null_count=binary.null_count)
    if typ == "dictionary":
        return arr.dictionary_encode()
    return arr if typ == "string" else arr.cast(TEXT_TYPES[typ], safe=False)


@settings(FUZZ, max_examples=200)
@given(values=st.lists(TEXT | st.none() | st.just("") | st.sampled_from(BAD_BYTES), min_size=1, max_size=30),
       typ=st.sampled_from(list(TEXT_TYPES) + list(ODD)), nested=st.booleans(), rows=st.integers(1, 8),
       damage=st.sampled_from(["none", "truncate", "flip"]), where=WHERE, bit=st.integers(0, 7),
       checksums=st.booleans())
def test_parquet_intact_or_counted_or_one_line(tmp_path_factory, values, typ, nested, rows, damage, where, bit,
                                               checksums):
    path = tmp_path_factory.mktemp("p") / "in.parquet"
    if typ in ODD:
        col = pa.array(ODD[typ].to_pylist() * len(values), ODD[typ].type)
    elif typ == "string_view" and any(isinstance(v, bytes) for v in values):
        values = [v for v in values if not isinstance(v, bytes)]  # a view cast validates UTF-8 itself
        col = text_array(values, typ)
    else:
        col = text_array(values, typ)
    cols = {"meta": pa.array([{"a": [1, 2], "b": {"c": "d"}}] * len(col))} if nested else {}
    pq.write_table(pa.table({**cols, "text": col}), path, row_group_size=rows, write_page_checksum=checksums)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: int(len(raw) * where)])
    elif damage == "flip":
        i = min(int(len(raw) * where), len(raw) - 1)
        path.write_bytes(raw[:i] + bytes([raw[i] ^ (1 << bit)]) + raw[i + 1 :])
    got = read([path])
    if typ in ODD or damage == "truncate":
        assert isinstance(got, str), got
    elif damage == "none":
        want = [v for v in values if isinstance(v, str) and v]
        skipped = Counter({"null": values.count(None), "empty": values.count(""),
                           "invalid": sum(isinstance(v, bytes) for v in values)})
        assert got == (want, +skipped) if want else isinstance(got, str)
    CASES[(f"parquet {'odd type' if typ in ODD else typ} {damage}", "error" if isinstance(got, str) else "read")] += 1


# ---------------------------------------------------------------- end to end through the CLI


def run_tokenize(inputs: list[Path], out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pretok_lib.cli", "tokenize", *map(str, inputs), "--out", str(out),
                           "--tokenizer", str(GPT2_JSON), "--workers", "0", "--no-progress", *extra],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@settings(FUZZ, max_examples=8)
@given(gen=jsonl_lines(), codec=st.sampled_from(["", "gz", "zst"]),
       damage=st.sampled_from(["none", "truncate", "flip"]), where=st.floats(0.05, 0.95),
       threshold=st.sampled_from(["0.1", "1"]))
def test_cli_end_to_end_exit_0_complete_or_one_line(tmp_path_factory, gen, codec, damage, where, threshold):
    """Exit 0 with a manifest counting every document and skip, or exit 1 with one line and no manifest."""
    lines, texts, skipped = gen
    raw = b"".join(lines)
    file = compress(raw, codec, 1)[0][0] if codec else raw
    if damage == "truncate":
        file = file[: int(len(file) * where)]
    elif damage == "flip" and file:
        i = int(len(file) * where)
        file = file[:i] + bytes([file[i] ^ 0x10]) + file[i + 1 :]
    base = tmp_path_factory.mktemp("e")
    path = base / ("in.jsonl" + (f".{codec}" if codec else ""))
    path.write_bytes(file)
    r = run_tokenize([path], base / "out", "--max-bad-fraction", threshold)
    assert "Traceback" not in r.stderr, r.stderr
    manifest = base / "out" / "manifest.json"
    if r.returncode == 0:
        m = json.loads(manifest.read_text())
        want_texts, want_skipped = reference_jsonl(file if not codec else raw)
        assert m["counts"]["documents"] == len(want_texts) and m["counts"]["skipped"] == dict(want_skipped)
        assert damage == "none" or not codec or (damage == "flip" and reference_jsonl(raw) == (texts, +skipped))
        assert sum(want_skipped.values()) <= float(threshold) * (len(want_texts) + sum(want_skipped.values()))
    else:
        assert r.returncode == 1 and not manifest.exists(), r.stderr
        line = one_line(r.stderr)
        if not codec or damage == "none":  # an error only where the contract calls for one
            plain = file if not codec else raw
            docs, bad = reference_jsonl(plain)
            assert (shape_error_expected(plain) or not docs or
                    sum(bad.values()) > float(threshold) * (len(docs) + sum(bad.values()))), line
    CASES[(f"cli jsonl{'.' + codec if codec else ''} {damage}", "exit 0" if r.returncode == 0 else "error")] += 1


# ---------------------------------------------------------------- separators split as on the whole file


SEPARATORS = [r"\n\n+", r"(?<=\.)\n", r"\n(?=[A-Z])", r"\b\.\s", r"(?m)^(?=S)", r"(x)y", r"(?<=\.)", r"a|(?=b)",
              r"(?<=a)(?=b)", r"\.\s*", r"(?<!a)b+", r"^S|E$", r"(?s)S(?:.{0,3}?E)?"]


def whole_text_pieces(sep: re.Pattern, text: str) -> list[str]:
    """The contract: the pieces between the separator's matches on the whole text (`re.split` without groups)."""
    pieces, at = [], 0
    for m in sep.finditer(text):
        pieces.append(text[at:m.start()])
        at = m.end()
    return pieces + [text[at:]]


@settings(FUZZ, max_examples=400)
@given(parts=st.lists(st.sampled_from(["a", "b", ".", " ", "\n", "\n\n", "S", "E", "xy", "x", "A", ".\n", ". "]),
                     max_size=60),
       pattern=st.sampled_from(SEPARATORS), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
       window=st.sampled_from([6, 8, 16]))
def test_streamed_split_equals_the_whole_text_split(parts, pattern, sizes, window):
    """Look-behinds, look-aheads, word boundaries, `^`/`$`, empty matches, groups and lazy tails that span less than
    the window split in streamed chunks of any size exactly as on the whole text (the reader streams txt files)."""
    from pretok_lib.sources.read import split_stream

    sep, text = re.compile(pattern), "".join(parts)
    chunks, at = [], 0
    while at < len(text):  # chunks of the drawn sizes in turn: block edges everywhere
        size = sizes[len(chunks) % len(sizes)]
        chunks.append((text[at:at + size], False))
        at += size
    chunks.append(("", True))
    want = whole_text_pieces(sep, text)
    if not sep.groups:
        assert want == re.split(sep, text)
    assert list(split_stream(sep, chunks, window=window)) == want


def test_a_look_behind_separator_splits_a_file_as_on_the_whole_text(tmp_path):
    """`(?<=\\.)\\n` over 2 MB read in 4 KB blocks: the block edges gave documents a leading newline and the file's
    final separator an extra document (6001 instead of 6000 on 70 KB)."""
    text = "".join(f"Sentence {i} ends here.\nit goes on\nand ends.\n" for i in range(50_000))
    path = tmp_path / "s.txt"
    path.write_text(text)
    got = read([path], separator=r"(?<=\.)\n", batch_bytes=4096, part_bytes=10**9)
    assert got == ([p for p in re.split(r"(?<=\.)\n", text) if p], Counter())
