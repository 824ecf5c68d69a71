"""Notebook 01's data steps: the study's corpus (the researcher's inputs, read as `pretok tokenize` reads them, split
into training and held-out documents: `split.py`) and tokenizer, every pretokenized dataset, and the tokenize
benchmark with the baselines the tokenizer allows."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import atomic_write_text
from ..datapaths import DEFAULT, FORMAT_OF, KIND_OF_FORMAT, ON_THE_FLY, PARQUET_KINDS, STUDY_PRETOKENIZED
from ..errors import PretokError
from ..formats import CODEC_GRID, FORMATS, TRAIN_COMPRESSION

KIND_OF = KIND_OF_FORMAT
# the held-out datasets every study run validates on: packed windows (every path), and the padded paths' own layout
HELDOUT_FORMATS = {k: (FORMAT_OF[k], None if k not in PARQUET_KINDS else TRAIN_COMPRESSION) for k in STUDY_PRETOKENIZED}
HF_BASELINES = ("loop", "datasets-map")   # the tokenize benchmark's baselines (a), (b): a HF fast tokenizer
if TYPE_CHECKING:
    from .steps import StudyPaths


def prepare_corpus(paths: StudyPaths, corpus: str | Sequence[str] = "", corpus_mb: float = 20.0, tokenizer: str = "",
                   vocab_size: int = 8192, text_column: str = "text", separator: str | None = None,
                   heldout: float = 0.02) -> dict:
    """The corpus and tokenizer of the study: `{"corpus": training documents (parquet), "heldout": held-out
    documents (parquet), "tokenizer", "corpus_info", "split"}`.

    `corpus`: files or globs (parquet, JSONL, txt, HF dataset dirs; relative: to the repository), read with
    `text_column` and `separator` as `pretok tokenize` reads them; empty: the embedded default corpus (Python
    sources of this install, `corpus_mb` MB). Its documents are split by `split.split_corpus` (`heldout`: the
    fraction held out for validation). Without a tokenizer, a byte-level BPE of `vocab_size` is trained on the
    training documents only (never on the held-out ones; reused while they are the same bytes); a tokenizer is a
    path or a hub name."""
    from ..demo.corpus import default_corpus, read_corpus_info, trained_tokenizer
    from .split import split_corpus
    from .steps import resolve

    info: dict[str, Any] = {}
    if corpus:
        inputs = [str(resolve(c)) for c in ([corpus] if isinstance(corpus, str) else corpus)]
        if len(inputs) == 1 and inputs[0].endswith(".parquet") and Path(inputs[0]).is_file():
            try:
                info = read_corpus_info(inputs[0]).to_dict()
            except PretokError:
                pass
        info = info or {"inputs": inputs}
    else:
        default = default_corpus(paths.data / "default", max_mb=corpus_mb)
        inputs, info = [default.path], default.to_dict()
    split = split_corpus(inputs, paths.data / "corpus", heldout, text_column, separator)
    if tokenizer:
        tok_path = str(resolve(tokenizer)) if resolve(tokenizer).exists() else tokenizer
    else:
        tok_path = str(trained_tokenizer(split.train, paths.data / "tokenizer", vocab_size, max_train_mb=corpus_mb))
    return {"corpus": split.train, "heldout": split.heldout, "tokenizer": tok_path, "corpus_info": info,
            "split": {"train_documents": split.train_docs, "heldout_documents": split.heldout_docs,
                      "heldout_fraction": heldout}}


def variant_name(fmt: str, compression: str | None) -> str:
    """Directory name of one format x codec (memmap has no codec), as `pretok bench loaders` names them."""
    from ..bench.loaders import variant_dir

    return variant_dir(fmt, compression or "none")


def _tokenize(corpus: str, out: Path, tokenizer: str, fmt: str, seq_len: int, comp: str | None, workers: int,
              bos: str, eos: str) -> dict:
    """One `pretok tokenize` of `corpus` into `out` (a finished output of the same config reused, one of another
    config rebuilt); its manifest."""
    from ..pretokenize import TokenizeConfig, run_tokenize

    cfg = TokenizeConfig(inputs=[corpus], out=str(out), tokenizer=tokenizer, format=fmt, seq_len=seq_len,
                         workers=workers, compression=comp or TRAIN_COMPRESSION, progress=False, bos=bos, eos=eos,
                         command=["pretok", "study", "pretokenize"])
    try:
        return run_tokenize(cfg)
    except PretokError as e:  # another config in the way (e.g. a changed corpus): rebuild it
        if "different config" not in str(e):
            raise
        cfg.overwrite = True
        return run_tokenize(cfg)


def pretokenize_all(paths: StudyPaths, corpus: str, tokenizer: str, seq_len: int,
                    compressions: Sequence[str] = CODEC_GRID, workers: int = 2,
                    echo: Callable[[str], None] | None = print, heldout: str = "", bos: str = "auto",
                    eos: str = "no") -> dict:
    """Every format (parquet ones with each codec, plus zstd:3 which training reads) of the training documents into
    `data/pretok-s<seq_len>/<variant>`, and the held-out documents (`heldout`) into `data/heldout-s<seq_len>/`
    (memmap and padded zstd:3: `HELDOUT_FORMATS`), with the `bos`/`eos` policy of `pretok tokenize`; finished
    outputs of the same config are reused. Writes and returns the dataset index `data/datasets.json`: corpus,
    tokenizer, seq_len, variants, the path of each data path, and `eval`: the held-out dataset of each layout."""
    import time

    base = paths.data / f"pretok-s{seq_len}"
    comps = list(dict.fromkeys([*compressions, TRAIN_COMPRESSION]))
    variants: dict[str, dict] = {}
    for fmt in FORMATS:
        for comp in ([None] if fmt == "memmap" else comps):
            name = variant_name(fmt, comp)
            out = base / name
            t0 = time.perf_counter()
            m = _tokenize(corpus, out, tokenizer, fmt, seq_len, comp, workers, bos, eos)
            secs = time.perf_counter() - t0
            variants[name] = {"path": str(out), "format": fmt, "compression": comp,
                              "documents": m["counts"]["documents"], "tokens": m["counts"]["tokens"],
                              "disk_bytes": sum(f["size"] for f in m["files"]), "seconds": round(secs, 2)}
            if echo:
                echo(f"{name:18s} {m['counts']['documents']:>8,} docs {m['counts']['tokens']:>12,} tokens "
                     f"{variants[name]['disk_bytes'] / 1e6:8.2f} MB  ({secs:.1f} s)")
    held: dict[str, str] = {}
    for kind, (fmt, comp) in (HELDOUT_FORMATS.items() if heldout else ()):
        out = paths.data / f"heldout-s{seq_len}" / variant_name(fmt, comp)
        m = _tokenize(heldout, out, tokenizer, fmt, seq_len, comp, workers, bos, eos)
        held[kind] = str(out)
        if echo:
            echo(f"held-out {kind:9s} {m['counts']['documents']:>8,} docs {m['counts']['tokens']:>12,} tokens "
                 "(validation only)")
    index = {"corpus": corpus, "heldout": heldout or None, "tokenizer": tokenizer, "seq_len": seq_len,
             "bos": bos, "eos": eos, "variants": variants,
             "paths": data_paths(corpus, {n: v["path"] for n, v in variants.items()}), "eval": held}
    paths.datasets_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.datasets_json, json.dumps(index, indent=2) + "\n")
    return index


def data_paths(corpus: str, variants: Mapping[str, str]) -> dict[str, str]:
    """`data.path` of each of the five data paths: the text corpus for the on-the-fly baselines, the zstd:3
    variant (or memmap) for the pretokenized ones."""
    out = dict.fromkeys(ON_THE_FLY, corpus)
    for fmt, kind in KIND_OF.items():
        out[kind] = variants[variant_name(fmt, None if fmt == "memmap" else TRAIN_COMPRESSION)]
    return out


def eval_path(index: Mapping, kind: str = DEFAULT) -> str:
    """The held-out dataset of `kind`'s layout (notebook 01's `eval`); PretokError for an index without one
    (written before the study held documents out: its validation would be the training data)."""
    held = index.get("eval") or {}
    if kind not in held:
        raise PretokError("the dataset index has no held-out split (made before the study held documents out for "
                          "validation): rerun notebook 01_pretokenize", index.get("corpus"))
    return held[kind]


def hf_baselines_skipped(tokenizer: str) -> str | None:
    """Why the tokenize benchmark's baselines (a) per-document loop and (b) datasets.map, which time a HF fast
    tokenizer (`tokenizer.json`), cannot run with `tokenizer`; None when they can."""
    from ..tokenizer.files import identify

    try:
        kind = identify(tokenizer).kind
    except Exception as e:   # noqa: BLE001 - a hub name that cannot be loaded here, ...: the engine names it
        return f"the tokenizer could not be identified here ({e})"
    if kind == "hf-json":
        return None
    return (f"baselines (a) per-document loop and (b) datasets.map time a HF fast tokenizer (tokenizer.json); this "
            f"study's tokenizer is {kind} ({Path(tokenizer).name}): not measured, so no isolated speedup over them")


def bench_tokenize(paths: StudyPaths, index: Mapping, workers: int = 2, loop_mb: float = 2.0,
                   formats: Sequence[str] = FORMATS, skip: Sequence[str] = ("rss-scan",), repeat: int = 1) -> dict:
    """`pretok bench tokenize` on the study's training documents and tokenizer: per-document loop and
    datasets.map (the on-the-fly cost, on the first `loop_mb` MB) vs the in-memory ceiling vs the engine; JSON in
    `bench/tokenize.json`, with `skipped` (method: reason) where the tokenizer is not a HF tokenizer.json.
    The benchmark's own acceptance targets (about pretok, not the data) are not printed: `selfcheck`."""
    from ..bench.common import write_json
    from ..bench.tokenize import TokenizeBench, run
    from .selfcheck import quiet_targets

    why = hf_baselines_skipped(index["tokenizer"])
    skip = list(dict.fromkeys([*skip, *(HF_BASELINES if why else ())]))
    if why:
        print(f"skipped: {why}")
    json_path = paths.bench / "tokenize.json"
    with quiet_targets():
        result = run(TokenizeBench(corpus=index["corpus"], tokenizer=index["tokenizer"],
                                   workdir=str(paths.bench / "tokenize"), workers=workers, loop_mb=loop_mb,
                                   rss_scan="", formats=list(formats), skip=skip, repeat=repeat, json=str(json_path)))
    if why:
        result["skipped"] = dict.fromkeys(HF_BASELINES, why)
        write_json(json_path, result)
    return result
