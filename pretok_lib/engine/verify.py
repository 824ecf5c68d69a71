"""`pretok inspect` (manifest summary + stats) and `pretok verify` (checksums, structure, sample vs source)."""

from __future__ import annotations

import os
import random
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import PretokError, os_error
from ..formats import memmap as mm
from ..formats import parquet as pqf
from ..formats.manifest import read_manifest
from ..sources import SourceOptions, Unit, read_unit
from ..sources.remote import is_url
from .parts import add_special, unit_breaks
from .run import MEMMAP_PREFIX, input_checksum

MIN_TIMED_SECONDS = 0.1  # a rate is printed only from a phase at least this long (timings are rounded to 1 ms)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A data file that cannot be decoded (damaged page header, truncated, edited) or read: one line naming it."""
    import pyarrow as pa

    try:
        yield
    except OSError as e:
        raise os_error(e, path, "cannot read it") from None
    except (pa.ArrowException, ValueError, struct.error) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PretokError(f"cannot decode its data ({first}); damaged or modified: pretok verify checks its "
                          "checksum", path) from None


def document_lengths(out_dir: str | os.PathLike, manifest: dict) -> np.ndarray:
    """Stored length of every document (real tokens, without padding), in order."""
    out = Path(out_dir)
    if manifest["format"] == "memmap":
        with _reading(out / f"{MEMMAP_PREFIX}.idx"):
            return np.asarray(mm.MemmapDataset(out / MEMMAP_PREFIX, manifest["dtype"]).lengths, dtype=np.int64)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lens = []
    for f in manifest["files"]:
        pqf.read_contract(out / f["path"], manifest["format"])
        with _reading(out / f["path"]):
            if manifest["format"] == "padded":
                t = pq.read_table(out / f["path"], columns=["attention_mask"])
                col = t.column(0).combine_chunks()
                pqf.check_no_nulls(col, out / f["path"], None, "attention_mask")
                L = col.type.list_size
                lens.append(col.flatten().to_numpy(zero_copy_only=False).reshape(-1, L).sum(axis=1, dtype=np.int64))
            else:
                t = pq.read_table(out / f["path"], columns=["input_ids"])
                col = t.column(0).combine_chunks()
                pqf.check_no_nulls(col, out / f["path"], None)
                lens.append(pc.list_value_length(col).to_numpy().astype(np.int64))
    return np.concatenate(lens) if lens else np.zeros(0, np.int64)


def id_problems(out: Path, m: dict) -> list[str]:
    """Every stored id (padding included) is a token of the manifest's tokenizer: in [0, vocab_size), no null."""
    import pyarrow.parquet as pq

    vocab = m["tokenizer"]["vocab_size"]
    try:
        if m["format"] == "memmap":
            ds = mm.MemmapDataset(out / MEMMAP_PREFIX, m["dtype"])
            step = 1 << 24
            with _reading(Path(ds.bin_path)):
                for start in range(0, len(ds.tokens), step):
                    pqf.check_ids(ds.tokens[start : start + step], vocab, ds.bin_path)
            return []
        for f in m["files"]:
            path = out / f["path"]
            with _reading(path):
                pf = pq.ParquetFile(path)
                for g in range(pf.num_row_groups):
                    col = pf.read_row_group(g, columns=["input_ids"]).column(0).combine_chunks()
                    pqf.check_no_nulls(col, path, g)
                    pqf.check_ids(col.flatten().to_numpy(zero_copy_only=False), vocab, path, g)
    except PretokError as e:
        return [str(e)]
    return []


def inspect(out_dir: str | os.PathLike) -> dict:
    """Manifest summary and statistics computed from the data files."""
    m = read_manifest(out_dir)
    lens = document_lengths(out_dir, m)
    disk = sum(f["size"] for f in m["files"])
    c = m["counts"]
    stats = {"documents": int(len(lens)), "tokens": int(lens.sum()), "disk_bytes": disk,
             "bytes_per_token": disk / max(int(lens.sum()), 1),
             "doc_tokens": {"mean": float(lens.mean()) if len(lens) else 0.0,
                            "p50": float(np.percentile(lens, 50)) if len(lens) else 0.0,
                            "p99": float(np.percentile(lens, 99)) if len(lens) else 0.0,
                            "max": int(lens.max()) if len(lens) else 0}}
    if m["format"] == "padded":
        slots = c["documents"] * m["policy"]["row_length"]
        stats["padding_fraction"] = c["padding"] / max(slots, 1)
        stats["truncated_fraction"] = c["truncated"] / max(c["truncated"] + c["tokens"], 1)
    return {"manifest": m, "stats": stats}


def format_inspect(report: dict) -> str:
    m, s = report["manifest"], report["stats"]
    t, c, pol = m["tokenizer"], m["counts"], m["policy"]  # padded only: pad and seq_len (others store no padding)
    backend = t.get("backend") if isinstance(t.get("backend"), dict) else {}  # descriptive fields: may be absent
    lines = [f"format      {m['format']} v{m['format_version']}  dtype {m['dtype']}"
             + (f"  compression {m['compression']}" if m.get("compression") else ""),
             f"tokenizer   {t.get('spec')} ({t.get('kind')}, vocab {t['vocab_size']}, {t['fingerprint'][:19]}…, "
             f"backend {backend.get('backend', 'unrecorded')})",
             f"policy      bos={pol['bos_id']} eos={pol['eos_id']}"
             + (f" pad={pol['pad_id']} seq_len={pol['seq_len']}" if m["format"] == "padded" else ""),
             *_boundary_lines(m),
             f"documents   {c['documents']:,}  tokens {c['tokens']:,}  skipped {c.get('skipped') or 0}",
             f"doc tokens  mean {s['doc_tokens']['mean']:.1f}  p50 {s['doc_tokens']['p50']:.0f}  "
             f"p99 {s['doc_tokens']['p99']:.0f}  max {s['doc_tokens']['max']:,}",
             f"disk        {s['disk_bytes'] / 1e6:.2f} MB in {len(m['files'])} files, "
             f"{s['bytes_per_token']:.3f} bytes/token"]
    if "padding_fraction" in s:
        lines.append(f"padding     {s['padding_fraction']:.1%} of slots; truncated {c['truncated']:,} tokens "
                     f"({s['truncated_fraction']:.2%})")
    tool = m["tool"] if isinstance(m["tool"], dict) else {}
    lines.append(f"created     {m['created']} by {tool.get('name', 'pretok')} {tool.get('version', '')}".rstrip())
    run = m.get("run") or {}
    if run.get("tokenize_seconds") is not None:  # outputs of earlier versions have the wall time only
        secs = run["tokenize_seconds"]
        rate = (f"{c['input_bytes'] / 1e6 / secs:.1f} MB/s" if secs >= MIN_TIMED_SECONDS
                else "too short to time a rate")
        lines.append(f"run         {run['wall_seconds']:.2f} s with {run['workers']} workers: start-up "
                     f"{run['startup_seconds']:.2f} s, tokenizing {secs:.2f} s ({rate}), "
                     f"finish {run['finish_seconds']:.2f} s; worker peak RSS {run['worker_peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def _boundary_lines(m: dict) -> list[str]:
    """What lies between documents and where the tokenizer's specials were found (absent from older outputs)."""
    t, lines = m["tokenizer"], []
    sep = (m.get("boundaries") or {}).get("separator", "") if isinstance(m.get("boundaries"), dict) else ""
    if sep != "":
        lines.append("separator   " + {"row": "none needed: one document a row",
                                       None: "NONE: packed documents run together"}.get(sep, f"{sep} between documents"))
    sources = t.get("special_sources") if isinstance(t.get("special_sources"), dict) else {}
    found = [f"{r}={t.get(f'{r}_id')} ({sources.get(r) or 'not found'})" for r in ("bos", "eos", "pad")
             if (r in sources and r != "pad") or t.get(f"{r}_id") is not None]   # pad: shown where found
    if sources and found:
        lines.append("specials    " + " ".join(found) + " in the tokenizer")
    return lines


@dataclass
class VerifyReport:
    files_checked: int = 0
    documents_checked: int = 0
    ids_equal: int = 0
    text_roundtrip_equal: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _stored_docs(out: Path, m: dict, part: dict, ds: mm.MemmapDataset | None = None) -> Iterator[np.ndarray]:
    if m["format"] == "memmap":
        for i in range(part["first_document"], part["first_document"] + part["documents"]):
            yield ds[i]
    else:
        for f in part["files"]:
            with _reading(out / f):
                yield from pqf.iter_documents(out / f)


def _source_docs(part: dict, m: dict, remap: dict[str, str]) -> Iterator[str]:
    u = dict(part["unit"])
    u["paths"] = tuple(remap.get(p, p) for p in u["paths"])
    for p in u["paths"]:
        if not is_url(p) and not Path(p).exists():  # a URL that is gone: one line when it is read
            raise PretokError("source input is missing: pass --source with its new location", p)
    s = m["source"]
    opts = SourceOptions(s["text_column"], s["separator"], s["bad_docs"], s["part_bytes"], s["batch_bytes"])
    for batch in read_unit(Unit(**u), opts):
        yield from batch.texts


def source_problems(recorded: list[dict], remap: dict[str, str]) -> list[str]:
    """How each local source (`remap`ped, else the path recorded) differs from the input the manifest records:
    its size (an HF dataset directory: its Arrow files'), then its checksum where one is recorded. A prefix of
    the input, a copy cut in place or rewritten is another input, not one whose sampled documents happen to match.
    Its location and mtime may differ (a copy)."""
    from ..formats import checksum

    problems = []
    for i in recorded:
        path = remap.get(i["path"], i["path"])
        if is_url(path):  # a remote object's version is checked when it is read
            continue
        if not os.path.exists(path):
            raise PretokError("source input is missing: pass --source with its new location", path)
        want = checksum.recorded(i)
        try:
            size = (sum(f.stat().st_size for f in Path(path).glob("*.arrow")) if os.path.isdir(path)
                    else os.path.getsize(path))
            if size != i["size"]:
                problems.append(f"{path}: source has {size} bytes, the manifest records {i['size']} for input "
                                f"{i['path']} (cut, grown or another file)")
            elif want and input_checksum(path, checksum.algorithm_of(want)) != want:
                problems.append(f"{path}: source's checksum differs from the one the manifest records for input "
                                f"{i['path']} (changed or another file)")
        except OSError as e:
            raise os_error(e, path, "cannot read the source") from None
    return problems


def _file_problems(out: Path, m: dict, f: dict) -> list[str]:
    """How a data file differs from its manifest entry's checksum; for a tree checksum, which part is damaged."""
    from ..formats import checksum

    want = checksum.recorded(f)
    if checksum.algorithm_of(want) != checksum.PARTS:
        return [] if checksum.matches(out / f["path"], want) else [
            f"{out / f['path']}: checksum differs from manifest.json (corrupted or modified)"]
    bad = checksum.damaged_leaf(out / f["path"], want, f.get("leaves"))
    if bad is None:
        return []
    if bad < 0 or bad >= len(m["parts"]):
        return [f"{out / f['path']}: checksum differs from manifest.json (its size or its recorded part hashes)"]
    offset = sum(int(size) for size, _ in f["leaves"][:bad])
    return [f"{out / f['path']}: checksum differs from manifest.json: the bytes of {m['parts'][bad]['part']} "
            f"(from byte {offset}) are corrupted or modified"]


def verify(out_dir: str | os.PathLike, sources: Sequence[str] | None = None, sample: int = 64,
           seed: int = 0) -> VerifyReport:
    """Check checksums and structure, then re-tokenize a sample of documents from the source and compare."""
    from ..tokenizer import backends_for, load_tokenizer, make_encoder

    out, rep = Path(out_dir), VerifyReport()
    m = read_manifest(out)
    for f in m["files"]:
        rep.files_checked += 1
        with _reading(out / f["path"]):
            rep.problems += _file_problems(out, m, f)
    if rep.problems:  # damaged data is not decoded further: the checksum says all there is to say
        return rep
    rep.problems += id_problems(out, m)
    if rep.problems:
        return rep
    rep.problems += [f"{out}: {b} (parts planned with different settings: documents read twice or never)"
                     for b in unit_breaks(m["parts"])]
    lens = document_lengths(out, m)
    if len(lens) != m["counts"]["documents"] or int(lens.sum()) != m["counts"]["tokens"]:
        rep.problems.append(f"{out}: data holds {len(lens)} docs / {int(lens.sum())} tokens, manifest says "
                            f"{m['counts']['documents']} / {m['counts']['tokens']}")
    if rep.problems or sample <= 0 or not m["counts"]["documents"]:
        return rep
    inputs = [i["path"] for i in m["inputs"]]
    if sources is not None and len(sources) != len(inputs):
        raise PretokError(f"--source got {len(sources)} inputs, the manifest lists {len(inputs)}")
    remap = dict(zip(inputs, sources)) if sources else {}
    rep.problems += source_problems(m["inputs"], remap)
    if rep.problems:  # another file than the one tokenized: its documents would be compared where they agree
        return rep
    info = load_tokenizer(m["tokenizer"]["spec"])
    if info.fingerprint != m["tokenizer"]["fingerprint"]:
        raise PretokError("tokenizer file changed since pretokenization (fingerprint differs)", info.spec)
    enc = make_encoder(info, backends_for(info)[-1])  # the reference implementation, not the fast one
    rng = random.Random(seed)
    picks = sorted(rng.sample(range(m["counts"]["documents"]), min(sample, m["counts"]["documents"])))
    pol = m["policy"]
    L = pol["row_length"] if m["format"] == "padded" else None  # other formats store whole documents
    ds = mm.MemmapDataset(out / MEMMAP_PREFIX, m["dtype"]) if m["format"] == "memmap" else None  # opened once
    for part in m["parts"]:
        a, b = part["first_document"], part["first_document"] + part["documents"]
        want = {i - a for i in picks if a <= i < b}
        if not want:
            continue
        for j, (stored, text) in enumerate(zip(_stored_docs(out, m, part, ds), _source_docs(part, m, remap))):
            if j not in want:
                continue
            ids, offs = enc.encode_batch([text])
            ids, _ = add_special(ids, offs, pol["bos_id"], pol["eos_id"])
            expect = ids[:L]
            rep.documents_checked += 1
            if np.array_equal(np.asarray(stored, dtype=np.int64), expect.astype(np.int64)):
                rep.ids_equal += 1
            else:
                rep.problems.append(f"{out}: document {a + j} differs from re-tokenized source {part['unit']['paths'][0]}")
            body = np.asarray(stored)[(pol["bos_id"] is not None):]
            if pol["eos_id"] is not None and len(body) and m["format"] != "padded":
                body = body[:-1]
            if len(expect) == len(ids) and enc.decode(body) == text:
                rep.text_roundtrip_equal += 1
    return rep
