"""Embedded default corpus and tokenizer: real Python source from this install, no network needed.

The corpus is one document per `.py` file (full source text, docstrings included) from the standard
library, then chosen packages, then (if still short) every other installed top-level package sorted by
name, then repeated "epochs" of all of that (path suffixed `#epoch2`, ...; text identical). It is written
as deterministic zstd parquet with columns `text`, `source` (package name, "stdlib" for the standard
library) and `path` (relative to the package directory), build parameters in the
arrow schema metadata and the outcome (documents, repeats, packages, skipped) in the file metadata.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import PretokError, os_error

DEFAULT_PACKAGES = ("numpy", "pyarrow", "transformers", "datasets", "torch")
STDLIB = "stdlib"
SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")
METADATA_KEY = b"pretok_corpus"  # file key-value metadata: params + results
PARAMS_KEY = b"pretok_corpus_params"  # arrow schema metadata: build parameters
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_NEVER_AUTO = {"pretok_lib"}  # our own editable source changes under us: never auto-added


@dataclass
class CorpusInfo:
    """What a built corpus holds; `sha256` is of the parquet file itself."""

    path: str
    documents: int
    text_bytes: int
    packages: list[str]
    repeats: int
    sha256: str
    skipped: int = 0
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _package_roots(name: str) -> list[Path] | None:
    """Directories (or the single module file) of an importable top-level name; None if not importable."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return sorted({Path(p) for p in spec.submodule_search_locations if Path(p).is_dir()})
    if spec.origin and spec.origin.endswith(".py") and Path(spec.origin).is_file():
        return [Path(spec.origin)]
    return None  # extension module or builtin: no Python source


def _walk(root: Path) -> list[tuple[str, Path]]:
    """(relpath, abspath) of every .py under root, sorted by relpath; skips site-packages and __pycache__."""
    if root.is_file():
        return [(root.name, root)]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for fn in filenames:
            if fn.endswith(".py"):
                p = Path(dirpath, fn)
                found.append((p.relative_to(root).as_posix(), p))
    return sorted(found)


def installed_packages() -> list[str]:
    """Importable top-level packages/modules with Python source in site-packages, sorted by name."""
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    names = []
    for name in importlib.metadata.packages_distributions():
        if not name.isidentifier() or name.startswith("__") or name in _NEVER_AUTO:
            continue
        roots = _package_roots(name)
        if roots and any(s in r.resolve().parents for r in roots for s in site):
            names.append(name)
    return sorted(set(names), key=lambda n: (n.lower(), n))


def iter_source_files(
    packages: Sequence[str] | None = None, *, include_stdlib: bool = True, extend: bool = False
) -> Iterator[tuple[str, str, Path]]:
    """Yield (package, relpath, abspath) deterministically: stdlib, then `packages`, then (if `extend`)
    every other installed package by name. `packages=None` means the importable DEFAULT_PACKAGES;
    an explicitly named package that is not importable raises PretokError (eagerly)."""
    order: list[tuple[str, list[Path]]] = []
    if include_stdlib:
        order.append((STDLIB, [Path(sysconfig.get_paths()["stdlib"])]))
    for name in DEFAULT_PACKAGES if packages is None else packages:
        roots = _package_roots(name)
        if roots is None:
            if packages is not None:
                raise PretokError(f"unknown package {name!r} (not importable)")
            continue
        if all(name != n for n, _ in order):
            order.append((name, roots))

    def gen() -> Iterator[tuple[str, str, Path]]:
        for name, roots in order:
            for root in roots:
                for rel, p in _walk(root):
                    yield name, rel, p
        if extend:
            seen = {n for n, _ in order}
            for name in installed_packages():
                if name not in seen:
                    for root in _package_roots(name) or []:
                        for rel, p in _walk(root):
                            yield name, rel, p

    return gen()


def _params(max_mb: float, packages: Sequence[str] | None = None, row_group_mb: float = 2.0,
            min_doc_bytes: int = 1, include_stdlib: bool = True, extend: bool = True) -> dict:
    return {"max_mb": max_mb, "packages": None if packages is None else list(packages),
            "row_group_mb": row_group_mb, "min_doc_bytes": min_doc_bytes,
            "include_stdlib": include_stdlib, "extend": extend}


def build_corpus(
    out: str | os.PathLike,
    max_mb: float = 50.0,
    packages: Sequence[str] | None = None,
    row_group_mb: float = 2.0,
    min_doc_bytes: int = 1,
    *,
    include_stdlib: bool = True,
    extend: bool = True,
    replace: bool = False,
) -> CorpusInfo:
    """Write up to `max_mb` MB (1e6 bytes) of UTF-8 source text to parquet at `out`, atomically.

    Stops before the document that would exceed the cap (always at least one). If one pass over the
    sources is short, later passes ("epochs") repeat it with `#epochN` appended to `path`. Files that
    are not UTF-8 or shorter than `min_doc_bytes` are skipped (counted). Same install + args gives
    byte-identical output. A file already at `out` is replaced only if it is a corpus this function wrote, or
    with `replace` (a cache path the caller owns, rebuilt when damaged)."""
    if not (math.isfinite(max_mb) and max_mb > 0):
        raise PretokError(f"max_mb must be > 0, got {max_mb}", out)
    if not row_group_mb > 0:
        raise PretokError(f"row_group_mb must be > 0, got {row_group_mb}", out)
    out = Path(out)
    if out.is_dir():
        raise PretokError("is a directory: give the path of the parquet file to write", out)
    if not replace and (out.exists() or out.is_symlink()):  # replaced only if it is a corpus this function wrote
        try:
            read_corpus_info(out)
        except Exception:  # unreadable, not parquet, no or odd pretok metadata
            raise PretokError("exists and is not a pretok default corpus; it is not replaced: remove it or choose "
                              "another path", out) from None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return _build(out, max_mb, packages, row_group_mb, min_doc_bytes, include_stdlib, extend)
    except OSError as e:  # pyarrow's errors name no file ("No such file or directory"): name the output
        raise os_error(e, out) from None


def _build(out: Path, max_mb: float, packages: Sequence[str] | None, row_group_mb: float, min_doc_bytes: int,
           include_stdlib: bool, extend: bool) -> CorpusInfo:
    """build_corpus's writing, into a temp file renamed to `out` last."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cap, rg_cap = int(max_mb * 1e6), max(1, int(row_group_mb * 1e6))
    params = _params(max_mb, packages, row_group_mb, min_doc_bytes, include_stdlib, extend)
    iter_source_files(packages, include_stdlib=include_stdlib)  # validate names before writing anything

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    docs = total = skipped = 0
    used: list[str] = []
    epoch = repeats = 0
    full = False
    buf: dict[str, list[str]] = {"text": [], "source": [], "path": []}
    buf_bytes = 0
    schema = pa.schema([("text", pa.string()), ("source", pa.string()), ("path", pa.string())],
                       metadata={PARAMS_KEY: json.dumps(params, sort_keys=True)})
    writer = None
    try:   # the writer is made inside: a stop signal landing in its constructor (the file exists) removes the file
        writer = pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=["source"],
                                  write_statistics=["source", "path"])

        def flush() -> None:
            nonlocal buf_bytes
            if buf["text"]:
                writer.write_table(pa.table(buf, schema=schema), row_group_size=len(buf["text"]))
            for v in buf.values():
                v.clear()
            buf_bytes = 0

        while not full:
            epoch += 1
            epoch_docs = 0
            for name, rel, p in iter_source_files(packages, include_stdlib=include_stdlib, extend=extend):
                try:
                    raw = p.read_bytes()
                    text = raw.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    raw, text = b"", None
                if text is None or len(raw) < max(1, min_doc_bytes):
                    skipped += epoch == 1
                    continue
                if total + len(raw) > cap and docs > 0:
                    full = True
                    break
                buf["text"].append(text)
                buf["source"].append(name)
                buf["path"].append(rel if epoch == 1 else f"{rel}#epoch{epoch}")
                if name not in used:
                    used.append(name)
                repeats = epoch
                docs, epoch_docs, total, buf_bytes = docs + 1, epoch_docs + 1, total + len(raw), buf_bytes + len(raw)
                if buf_bytes >= rg_cap:
                    flush()
            if epoch_docs == 0 and not full:
                raise PretokError("no Python source documents found for the chosen packages", out)
        flush()
        result = {"documents": docs, "text_bytes": total, "packages": used, "repeats": repeats,
                  "skipped": skipped}
        writer.add_key_value_metadata({METADATA_KEY: json.dumps({"params": params, **result}, sort_keys=True)})
        writer.close()
        info = CorpusInfo(str(out), docs, total, used, repeats, _sha256(tmp), skipped, params)
        os.replace(tmp, out)
        return info
    finally:
        try:
            if writer is not None:
                writer.close()  # no-op if already closed
        finally:
            tmp.unlink(missing_ok=True)


def read_corpus_info(path: str | os.PathLike) -> CorpusInfo:
    """CorpusInfo of a corpus written by build_corpus (from its parquet metadata)."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        meta = pq.read_metadata(path).metadata or {}
        d = json.loads(meta[METADATA_KEY])
    except (OSError, KeyError, ValueError) as e:
        raise PretokError(f"not a pretok default corpus ({e})", path) from e
    return CorpusInfo(str(path), d["documents"], d["text_bytes"], d["packages"], d["repeats"],
                      _sha256(path), d.get("skipped", 0), d.get("params", {}))


def _write_atomic(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:   # after a failure or a stop signal: no temp file left (after the rename there is none)
        tmp.unlink(missing_ok=True)


def train_default_tokenizer(
    corpus: str | os.PathLike, out_dir: str | os.PathLike, vocab_size: int = 8192, max_train_mb: float = 20.0
) -> Path:
    """Train a deterministic byte-level BPE on the first `max_train_mb` MB of `corpus` texts.

    Writes `tokenizer.json`, `tokenizer_config.json` and, last (it marks completion),
    `pretok_default.json` into `out_dir`; returns the tokenizer.json path. Special tokens
    `<|endoftext|>` (id 0) and `<|pad|>` (id 1)."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus, out_dir = Path(corpus), Path(out_dir)
    if not corpus.is_file():
        raise PretokError("corpus not found", corpus)
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise PretokError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)}, got {vocab_size}", out_dir)
    if not max_train_mb > 0:
        raise PretokError(f"max_train_mb must be > 0, got {max_train_mb}", out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / "pretok_default.json"
    marker.unlink(missing_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    docs = nbytes = 0

    def texts() -> Iterator[str]:  # the first max_train_mb of text, stopping before the doc that exceeds it
        nonlocal docs, nbytes
        for batch in pq.ParquetFile(corpus).iter_batches(batch_size=256, columns=["text"]):
            for t in batch.column(0).to_pylist():
                n = len(t.encode("utf-8"))
                if nbytes + n > max_train_mb * 1e6 and docs:
                    return
                docs, nbytes = docs + 1, nbytes + n
                yield t

    tok.train_from_iterator(texts(), trainer=trainer)
    tok_path = out_dir / "tokenizer.json"
    _write_atomic(tok_path, tok.to_str(pretty=True))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL_TOKENS[0],
              "eos_token": SPECIAL_TOKENS[0], "pad_token": SPECIAL_TOKENS[1], "add_prefix_space": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000_000}
    _write_atomic(out_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    record = {"corpus": corpus.name, "corpus_sha256": _sha256(corpus), "vocab_size": vocab_size,
              "actual_vocab_size": tok.get_vocab_size(), "max_train_mb": max_train_mb,
              "train_documents": docs, "train_bytes": nbytes, "tokenizer_sha256": _sha256(tok_path)}
    _write_atomic(marker, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return tok_path


def default_corpus(cache_dir: str | os.PathLike, max_mb: float = 20.0) -> CorpusInfo:
    """Build (once) `cache_dir/corpus.parquet`; reuse it when present, complete and built with the same
    parameters."""
    corpus = Path(cache_dir) / "corpus.parquet"
    try:
        info: CorpusInfo | None = read_corpus_info(corpus) if corpus.is_file() else None
    except PretokError:  # not ours or unreadable: rebuild
        info = None
    if info is None or info.params != _params(max_mb):
        info = build_corpus(corpus, max_mb=max_mb, replace=True)  # our cache: a damaged one is rebuilt
    return info


def trained_tokenizer(corpus: str | os.PathLike, out_dir: str | os.PathLike, vocab_size: int = 8192,
                      max_train_mb: float = 20.0) -> Path:
    """`train_default_tokenizer`, unless `out_dir` holds one trained on these bytes with these settings (its
    `pretok_default.json` says so, and the tokenizer's own checksum holds): then that one."""
    out_dir = Path(out_dir)
    tok_path, marker = out_dir / "tokenizer.json", out_dir / "pretok_default.json"
    try:
        rec = json.loads(marker.read_text())
        ok = (rec["corpus_sha256"] == _sha256(Path(corpus)) and rec["vocab_size"] == vocab_size
              and rec["max_train_mb"] == max_train_mb and tok_path.is_file()
              and _sha256(tok_path) == rec["tokenizer_sha256"])
    except (OSError, KeyError, ValueError):
        ok = False
    return tok_path if ok else train_default_tokenizer(corpus, out_dir, vocab_size=vocab_size,
                                                       max_train_mb=max_train_mb)


def default_corpus_and_tokenizer(
    cache_dir: str | os.PathLike, max_mb: float = 20.0, vocab_size: int = 8192
) -> tuple[CorpusInfo, Path]:
    """Build (once) `cache_dir/corpus.parquet` and `cache_dir/tokenizer/tokenizer.json` (trained on the whole
    corpus: `pretok demo`'s; the study trains its own on its training split); reuse them when present, complete
    and built with the same parameters."""
    info = default_corpus(cache_dir, max_mb)
    return info, trained_tokenizer(info.path, Path(cache_dir) / "tokenizer", vocab_size, max_mb)
