"""A run directory belongs to one config: resuming it, or finding it complete, under another would mix two runs or
report the old one's results as the new one's. `changed(run_dir, cfg, world)` names what differs (docs/RUNS.md).

What may change between the attempts of one run (requeue, elastic resume, another node) is exempt: where the run
lives and what it is called, operational settings (loader workers, cache, checksum on open, logging, checkpoint
cadence, device), and the split of the global batch (micro-batch x ranks x accumulation: the product, recorded in
run.json, must stay). A value resolved at run time (`RESOLVED_AT_RUN_TIME`: `auto`, or unset, where the run recorded
what it resolved to) matches whatever was recorded; any other setting left out that the run had set is a change.
Existing paths compare after resolving links, and relative ones against the directory each attempt ran in
(run.json's `cwd`).

A run is also its data: run.json's `data_fingerprint` (the data identity of each pretokenized dataset) and
tokenizer fingerprint must match what the config's paths hold now (`data_changes`): the same path re-tokenized
from another corpus or with another tokenizer is another run. Mixture weights compare as the shares they realise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from ..data.blend import rational_weights
from ..datapaths import ON_THE_FLY
from ..errors import PretokError
from ..formats.manifest import data_identity, read_manifest
from . import strict_yaml
from .config import Config
from .run_record import flatten, read_run_record

EXEMPT_KEYS = {"name", "run.id", "run.dir", "run.overwrite", "data.num_workers", "data.verify_on_open",
               "data.cache_mb", "data.micro_batch", "train.grad_accum", "hardware.device"}
EXEMPT_SECTIONS = ("log.", "checkpoint.")
PATH_KEYS = {"data.path", "data.tokenizer", "eval.path", "eval.own_path"}
# Settings whose unset value (None / "auto") the run resolves itself; config.yaml records what it resolved to.
RESOLVED_AT_RUN_TIME = {"train.precision": "auto", "model.vocab_size": None, "model.intermediate_size": None,
                        "data.order": None}
_DEFAULTS = flatten(Config().to_dict())


def _path(p: Any, cwd: str | None = None) -> Any:
    """A local path that exists, resolved (links, and relative to `cwd`, default the working directory); anything
    else as written (URLs, names such as a tiktoken encoding, paths gone since)."""
    if isinstance(p, list):
        return [_path(x, cwd) for x in p]
    if isinstance(p, str) and p and "://" not in p:
        full = os.path.join(cwd, p) if cwd else p
        if os.path.exists(full):
            return os.path.realpath(full)
    return p


def _norm(key: str, v: Any, cwd: str | None = None) -> Any:
    if key in PATH_KEYS:
        return _path(v, cwd)
    if key == "data.mixture" and isinstance(v, list):
        return [{**e, "path": _path(e.get("path"), cwd)} if isinstance(e, dict) else e for e in _shares(v)]
    return v


def _shares(mixture: list) -> list:
    """A mixture's weights as the exact shares the blend realises ("3/10"): 3/7 is 0.3/0.7 (blend.py)."""
    try:
        p, q = rational_weights([e["weight"] for e in mixture])
    except (ValueError, TypeError, KeyError):
        return mixture      # compared as written; the config check says what is wrong with them
    return [{**e, "weight": f"{pj}/{q}"} for e, pj in zip(mixture, p)]


def _exempt(key: str) -> bool:
    return key in EXEMPT_KEYS or key.startswith(EXEMPT_SECTIONS)


def differences(saved: dict, new: dict, saved_cwd: str | None = None) -> list[str]:
    """`key: saved -> new` for every identity key (present in both) whose values differ; `saved_cwd`: the directory
    the saved config's relative paths were given in (default: the working directory, as the new config's). A key
    of the config that the saved one lacks (written before the key existed) counts as its default, which keeps the
    behaviour from before it: a run without `eval.own_path` is not a run with one."""
    a, b = {**_DEFAULTS, **flatten(saved)}, flatten(new)
    out = []
    for key in sorted(a.keys() & b.keys()):
        if _exempt(key) or (key in RESOLVED_AT_RUN_TIME and b[key] == RESOLVED_AT_RUN_TIME[key]):
            continue
        old, cur = _norm(key, a[key], saved_cwd), _norm(key, b[key])
        if old != cur:
            out.append(f"{key}: {json.dumps(a[key], default=str)} -> {json.dumps(b[key], default=str)}")
    return out


def changed(run_dir: str | os.PathLike, cfg: Config, world: int) -> str | None:
    """Why `run_dir` (an earlier attempt: config.yaml, run.json) is not a run of `cfg` on `world` ranks; None when
    it is, or when it holds no earlier attempt. Unreadable records count as different (nothing is reused blind)."""
    run_dir = Path(run_dir)
    saved_cfg = run_dir / "config.yaml"
    if not saved_cfg.exists():
        return None
    try:
        saved = strict_yaml.load(saved_cfg.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, yaml.YAMLError) as e:
        return f"its config.yaml cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    record = read_run_record(run_dir) or {}
    diffs = differences(saved, cfg.to_dict(), record.get("cwd"))
    gb = record.get("global_batch", _summary_global_batch(run_dir))
    if gb is not None and gb != cfg.global_batch(world):
        diffs.append(f"global batch (micro-batch x ranks x grad_accum): {gb} -> {cfg.global_batch(world)}")
    data = data_changes(record, cfg)
    if not diffs and not data:
        return None
    shown = diffs + data
    shown = "; ".join(shown[:4]) + (f"; and {len(shown) - 4} more" if len(shown) > 4 else "")
    return f"holds a run of {'another config' if diffs else 'other data'} ({shown})"


def manifests_fingerprint(manifests: list[dict] | None) -> list[str] | None:
    """The data identities (`manifest.data_identity`: format, dtype, file checksums) of a run's pretokenized
    datasets, in the config's order; None for text tokenized on the fly (no manifest)."""
    return None if manifests is None else [data_identity(m) for m in manifests]


def source_fingerprint(source) -> list[str] | None:
    """`manifests_fingerprint` of an opened data source (a mixture, a pretokenized dataset; None: text tokenized
    on the fly), as the trainer records it in run.json's "data_fingerprint"."""
    if hasattr(source, "sources"):
        return manifests_fingerprint([s.m for s in source.sources])
    return None if getattr(source, "info", None) is not None else manifests_fingerprint([source.m])


def _manifests(kind: str, path: Any, mixture: list | None = None) -> list[dict] | None:
    if mixture:
        return [read_manifest(e.path) for e in mixture]
    if kind in ON_THE_FLY or not path:
        return None
    return [read_manifest(path)]


def data_fingerprint(cfg: Config, train: list[dict] | None = None) -> dict:
    """What the config's data is now, from its manifests (cheap: no data file is read; `train`: its training
    manifests, read already): {"train": ..., "eval": ..., "eval_own": ...} (`manifests_fingerprint`; eval_own:
    eval.own_path). PretokError/OSError when a manifest cannot be read."""
    d, e = cfg.data, cfg.eval
    train = train if train is not None else _manifests(d.kind, d.path, d.mixture)

    def held_out(kind: str, path: str | None) -> list[str] | None:
        return manifests_fingerprint(_manifests(kind, path)) if e.path and path else None

    return {"train": manifests_fingerprint(train), "eval": held_out(e.kind, e.path),
            "eval_own": held_out(e.own_kind, e.own_path)}


def data_changes(record: dict, cfg: Config) -> list[str]:
    """How the config's data differs from what the run recorded in run.json (`data_fingerprint`, the tokenizer's
    fingerprint): the same paths re-tokenized from another corpus or with another tokenizer are other data. Data
    that cannot be read now is not compared (the trainer refuses it when it opens it)."""
    saved, tok = record.get("data_fingerprint"), (record.get("tokenizer") or {}).get("fingerprint")
    if not isinstance(saved, dict) and not tok:
        return []
    try:
        manifests = _manifests(cfg.data.kind, cfg.data.path, cfg.data.mixture)
        now = data_fingerprint(cfg, manifests)
        now_tok = _tokenizer_fingerprint(cfg, manifests) if tok else None
    except (PretokError, OSError):
        return []
    out = []
    for split in ("train", "eval", "eval_own"):
        old = saved.get(split) if isinstance(saved, dict) else None
        if old is not None and now[split] is not None and old != now[split]:
            ids = ", ".join(f"{a[:18]}… -> {b[:18]}…" for a, b in zip(old, now[split]) if a != b)
            out.append(f"{split} data: its tokens changed since ({ids or f'{len(old)} -> {len(now[split])} datasets'})")
    if tok and now_tok and tok != now_tok:
        out.append(f"tokenizer fingerprint: {tok[:19]}… -> {now_tok[:19]}…")
    return out


def _tokenizer_fingerprint(cfg: Config, manifests: list[dict] | None) -> str | None:
    """The fingerprint of the tokenizer the config's training data is made with: its (first) manifest's, or the
    loaded data.tokenizer's for text tokenized on the fly."""
    if manifests:
        return manifests[0]["tokenizer"]["fingerprint"]
    if cfg.data.tokenizer:
        from ..tokenizer import load_tokenizer

        return load_tokenizer(cfg.data.tokenizer).fingerprint
    return None


def _summary_global_batch(run_dir: Path) -> int | None:
    """The global batch a completed run recorded in summary.json (run.json holds it since 2026-11-26)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())["global_batch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def inputs_inside(cfg: Config, run_dir: str | os.PathLike) -> str | None:
    """Why `run_dir` must not be emptied (run.overwrite, a sweep's rerun): the config reads data, a tokenizer or
    eval data inside it (deleting the directory deleted them); None when it reads nothing there."""
    d = cfg.data
    paths = [*(d.path if isinstance(d.path, list) else [d.path]), *(e.path for e in d.mixture), d.tokenizer,
             *(p for key in ("path", "own_path") for p in _as_list(getattr(cfg.eval, key)))]
    root = os.path.realpath(run_dir)
    inside = [str(p) for p in paths if isinstance(p, str) and p and os.path.exists(p)
              and Path(os.path.realpath(p)).is_relative_to(root)]
    if not inside:
        return None
    return (f"holds the run's own inputs ({', '.join(inside)}): emptying it for a fresh start would delete them; "
            "move them out of the run directory first")


def _as_list(p: Any) -> list:
    return p if isinstance(p, list) else [p]


def refusal(run_dir: str | os.PathLike, why: str) -> str:
    """The one-line error for a run directory that `changed` rejected."""
    return (f"{run_dir}: {why}: resuming it or reusing its results would mix two runs; run.overwrite=true starts "
            f"it over, or choose another run.id")
