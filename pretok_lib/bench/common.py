"""What the benchmarks share: their config base and its argparse bridge, the corpus and tokenizer they default to,
and how results are recorded (--json with the environment and the config that made them).

Each benchmark is a config dataclass (the one home of its defaults) and `run(cfg) -> dict`; its `add_args`
builds the `pretok bench ...` options with those defaults and `main(namespace)` is `run(from_args(...))`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PretokError

GPT2_REL = Path("shared/data/tokenizers/gpt2/tokenizer.json")
C = TypeVar("C", bound="BenchConfig")


@dataclass
class BenchConfig:
    """Settings every benchmark has: its input corpus and tokenizer, where it works, what it writes."""

    corpus: str | None = None     # parquet/jsonl input; None: the embedded corpus of `mb` MB, built in workdir
    mb: float = 20.0
    tokenizer: str | None = None  # None: ../shared/data's GPT-2 tokenizer.json if present, else the trained default
    workdir: str = "runs/bench"
    json: str | None = None       # write all results here
    check: bool = False           # raise when a target fails

    def record(self) -> dict:
        """The config as the results JSON records it."""
        return dataclasses.asdict(self)


def from_args(cls: type[C], args: argparse.Namespace) -> C:
    """The config of a parsed `pretok bench ...` command line (options named as the fields; others ignored)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (MB sizes: nan or inf reached `int(mb * 1e6)` as a traceback)."""
    return _finite(text, 0.0, open_low=True)


def non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0 (0 = off, e.g. `--pace-ms`)."""
    return _finite(text, 0.0, open_low=False)


def _finite(text: str, low: float, open_low: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > low if open_low else value >= low)):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if open_low else '>='} {low:g}, got {text}")
    return value


def at_least(low: int):
    """An argparse type: a whole number >= `low` (counts of batches, steps, repeats, ...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text}")
        return value

    parse.__name__ = f"whole number >= {low}"
    return parse


def counts(low: int = 0):
    """An argparse type: comma-separated whole numbers >= `low` ("0,2": DataLoader worker counts), kept as text."""
    one = at_least(low)

    def parse(text: str) -> str:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= {low}, got '{text}'")
        try:
            for t in items:
                one(t.strip())
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= {low}, got '{text}'") \
                from None
        return text

    parse.__name__ = "counts"
    return parse


def sizes(text: str) -> str:
    """An argparse type: comma-separated MB sizes, each a finite number > 0 ('' = none), kept as text."""
    for t in (t for t in text.split(",") if t.strip()):
        try:
            positive(t.strip())
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"must be comma-separated numbers > 0 (or ''), got '{text}'") from None
    return text


def add_common_args(p: argparse.ArgumentParser, cfg: BenchConfig, workdir_help: str) -> None:
    """--corpus, --mb, --tokenizer, --workdir with `cfg`'s defaults (--json and --check: `add_output_args`)."""
    p.add_argument("--corpus", default=cfg.corpus,
                   help="parquet/jsonl input (default: build the embedded corpus of --mb MB)")
    p.add_argument("--mb", type=positive, default=cfg.mb, help="size of the embedded default corpus to build")
    p.add_argument("--tokenizer", default=cfg.tokenizer,
                   help="tokenizer.json (default: ../shared/data GPT-2 if present, else the trained default)")
    p.add_argument("--workdir", default=cfg.workdir, help=workdir_help)


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, metavar="OUT", help="write all results here")
    p.add_argument("--check", action="store_true", help="exit 1 if a target fails")


def offline() -> None:
    """Benchmarks never reach the hub: the tokenizer is a path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def resolve_tokenizer(spec: str | None, workdir: Path) -> str:
    """The given spec, else ../shared/data's GPT-2 tokenizer.json, else the embedded default (trained once)."""
    if spec:
        return spec
    for cand in (Path.cwd().parent / GPT2_REL, Path(__file__).resolve().parents[3] / GPT2_REL):
        if cand.is_file():
            return str(cand.resolve())
    from ..demo.corpus import default_corpus_and_tokenizer

    return str(default_corpus_and_tokenizer(workdir / "default-tokenizer")[1])


def cached_corpus(workdir: Path, mb: float) -> Path:
    """`workdir/corpus-<mb>mb.parquet` (the embedded default corpus), built unless a matching one exists."""
    from ..demo.corpus import build_corpus, read_corpus_info

    path = workdir / f"corpus-{mb:g}mb.parquet"
    try:
        if path.is_file() and read_corpus_info(path).params.get("max_mb") == mb:
            return path
    except PretokError:
        pass
    build_corpus(path, max_mb=mb, replace=True)  # the bench's own cache: a damaged one is rebuilt
    return path


def corpus_repeats_note(path: str | Path) -> str:
    """For an embedded default corpus that repeats its sources (`demo/corpus.py`: passes over the same files when
    the install holds less text than asked for), how often and at least how much text is distinct; else ""."""
    from ..demo.corpus import read_corpus_info

    try:
        info = read_corpus_info(path)
    except PretokError:  # not an embedded corpus: nothing known about repeats
        return ""
    if info.repeats <= 1:
        return ""
    return (f"the embedded corpus repeats its sources: {info.repeats} passes, at least "
            f"{info.text_bytes / info.repeats / 1e6:.3g} MB of distinct text (encoder caches see the repeats, in the "
            "engine and the ceilings alike)")


def corpus_and_tokenizer(cfg: BenchConfig) -> tuple[Path, str, str]:
    """(workdir, created; the corpus, absolute: the given one or the cached embedded one; the tokenizer spec)."""
    work = Path(cfg.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tok = resolve_tokenizer(cfg.tokenizer, work)
    corpus = str(Path(cfg.corpus).resolve()) if cfg.corpus else str(cached_corpus(work, cfg.mb).resolve())
    return work, corpus, tok


def environment() -> dict:
    """The machine and software the results were measured on."""
    from ..machine.environment import environment as env

    return env()


def write_json(path: str | os.PathLike | None, result: Any, indent: int = 2) -> None:
    """`result` as JSON at `path` (parents created; written atomically: a full disk leaves the previous file, never
    a torn one that readers such as notebook 05 take for no results); nothing when `path` is None."""
    from ..atomic import atomic_write_text

    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(result, indent=indent, default=str) + "\n")


def check_targets(cfg: BenchConfig, failed: bool) -> None:
    """With `check`, a failed target is an error (exit 1 from the command line)."""
    if cfg.check and failed:
        raise PretokError("benchmark targets failed (see above)")
