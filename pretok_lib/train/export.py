"""A run's checkpoint as a Hugging Face model directory that transformers loads offline.

    pretok export runs/<id> [--out DIR] [--step N]       (a completed run also exports itself: checkpoint.export)

    DIR/ config.json  generation_config.json  model.safetensors     AutoModelForCausalLM.from_pretrained(DIR)
         tokenizer.json  tokenizer_config.json                       AutoTokenizer.from_pretrained(DIR)
         pretok_export.json                                          run, step, checkpoint checksums, tokenizer
The weights are the checkpoint's fp32 master weights (checked against its checksums first); the tokenizer is the
one the run's data was tokenized with (hf_tokenizer.py, checked to give the same ids). Where transformers cannot
reproduce it, one warning line says why and the model is exported alone. Written under a temp name and renamed
into place last, so DIR is either the previous export or the complete new one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch

from ..atomic import atomic_write_json
from ..errors import PretokError
from ..formats.manifest import read_manifest
from . import checkpoint, hf_tokenizer
from .config import Config, load_config
from .model import build_model

DEFAULT_DIR = "hf"
RECORD = "pretok_export.json"
EMBEDDING = "model.embed_tokens.weight"


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_config(run_dir: Path) -> Config:
    """The run's resolved config (config.yaml), or a one-line error saying the directory is no run."""
    if not run_dir.is_dir():
        raise PretokError("no such run directory", run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise PretokError("not a training run directory (no config.yaml)", run_dir)
    return load_config(run_dir / "config.yaml")


def pick_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The newest checkpoint (or that of `step`), checked against its checksums: damaged is an error, never a
    silent fall-back to an older one."""
    found = checkpoint.list_checkpoints(run_dir / "checkpoints")
    if step is not None:
        found = [p for p in found if p.name == f"step_{step:08d}"]
        if not found:
            raise PretokError(f"no checkpoint of step {step}", run_dir / "checkpoints")
    if not found:
        raise PretokError("no checkpoint to export (the run saved none yet)", run_dir / "checkpoints")
    path = found[-1]
    problem = checkpoint.damage(path)
    if problem:
        older = [p.name for p in checkpoint.list_checkpoints(run_dir / "checkpoints") if p != path]
        hint = f"; export an older one with --step ({', '.join(older)})" if older else ""
        raise PretokError(f"damaged checkpoint: {problem}{hint}", path)
    return path


def refuse_run_files(run_dir: Path, out: Path) -> None:
    """An --out that is the run directory, holds it or is among its checkpoints would be replaced by the export,
    the run's checkpoints, metrics and config with it (`--overwrite` did so): refused."""
    run, dest = run_dir.resolve(), out.resolve()
    ckpts = run / "checkpoints"
    if dest == run or run.is_relative_to(dest) or dest == ckpts or dest.is_relative_to(ckpts):
        raise PretokError(f"--out would replace the run's own files ({run_dir}): export into a directory of its own "
                          f"(default: {run_dir / DEFAULT_DIR})", out)


def load_model(cfg: Config, ckpt: Path):
    """The LlamaForCausalLM of `cfg` holding checkpoint `ckpt`'s weights (fp32, CPU)."""
    try:
        state = torch.load(ckpt / "model.pt", map_location="cpu", weights_only=True)
        model = build_model(cfg.model, state[EMBEDDING].shape[0], cfg.data.seq_len, cfg.run.seed)
        model.load_state_dict(state, strict=True)
    except Exception as e:  # noqa: BLE001 - a pickle, key or shape problem: one line
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise PretokError(f"model.pt does not hold this run's model ({type(e).__name__}: {msg})", ckpt) from None
    return model.float().eval()


def tokenizer_info(run_dir: Path, cfg: Config):
    """The TokenizerInfo of the tokenizer the run's data was made with (run.json's record, else the config's
    data.tokenizer or the pretokenized data's manifest), checked against its fingerprint."""
    from ..tokenizer import load_tokenizer

    rec = (_read_json(run_dir / "run.json") or {}).get("tokenizer") or {}
    spec, fingerprint = rec.get("spec"), rec.get("fingerprint")
    if not spec:
        spec = cfg.data.tokenizer
        if not spec and cfg.data.kind.startswith("pretok-") and isinstance(cfg.data.path, str):
            tok = read_manifest(cfg.data.path)["tokenizer"]
            spec, fingerprint = tok["spec"], tok["fingerprint"]
    if not spec:
        raise PretokError("the run names no tokenizer (no data.tokenizer, no manifest)", run_dir)
    info = load_tokenizer(spec)
    if fingerprint and info.fingerprint != fingerprint:
        raise PretokError(f"tokenizer changed since the run's data was tokenized ({fingerprint[:19]}...)", spec)
    return info


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _save_model(model, directory: Path) -> None:
    """save_pretrained (config + model.safetensors); safetensors' I/O errors (not OSErrors: "I/O error: No
    space left on device (os error 28)") raised as the OSError they are, naming the file."""
    try:
        with checkpoint.names_path(directory), _quiet():
            model.save_pretrained(str(directory), safe_serialization=True)
    except OSError:
        raise
    except Exception as e:
        err = hf_tokenizer.rust_os_error(e, directory / "model.safetensors")
        if err is None:
            raise
        raise err from None


@contextlib.contextmanager
def _quiet():
    """No transformers progress bar ("Writing model shards") in a run's log."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _fsync_tree(path: Path) -> None:
    """fsync every file of `path` (made readable as the umask allows: safetensors writes 0600) and `path`."""
    mask = os.umask(0)
    os.umask(mask)
    for p in sorted(path.rglob("*")):
        if p.is_file():
            os.chmod(p, 0o666 & ~mask)
    for p in [*sorted(path.rglob("*")), path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, step: int | None = None,
               overwrite: bool = False, warn: Callable[[str], None] = _warn, record: bool = True) -> dict:
    """Export checkpoint `step` (default: the newest) of `run_dir` into `out` (default: <run_dir>/hf) and
    return what was exported (also written to `out`/pretok_export.json and, with `record` and a run that is
    not running, to run.json's "export"). A tokenizer transformers cannot reproduce is one `warn` line."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    ckpt = pick_checkpoint(run_dir, step)
    out = Path(out) if out is not None else run_dir / DEFAULT_DIR
    refuse_run_files(run_dir, out)
    if out.exists() and not overwrite and not (out / RECORD).is_file():
        raise PretokError("exists and is not a pretok export (use --overwrite to replace it)", out)
    model = load_model(cfg, ckpt)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tok_status, info = _tokenizer(run_dir, cfg, tmp, warn)
        if info is not None:
            # (config.pad_token_id stays unset: Llama makes it the embedding's padding_idx, which training had not)
            model.config.bos_token_id, model.config.eos_token_id = info.bos_id, info.eos_id
            model.generation_config.bos_token_id = info.bos_id
            model.generation_config.eos_token_id = info.eos_id
            model.generation_config.pad_token_id = info.pad_id if info.pad_id is not None else info.eos_id
        model.config.use_cache = True          # training disables the KV cache; generation wants it
        model.generation_config.use_cache = True
        _save_model(model, tmp)
        result = {"run_id": run_dir.name, "step": int(checkpoint.STEP_DIR.match(ckpt.name).group(1)),
                  "checkpoint": os.path.relpath(ckpt, run_dir),
                  "checksums": _read_json(ckpt / checkpoint.CHECKSUMS),
                  "dtype": "float32", "params": sum(p.numel() for p in model.parameters()),
                  "tokenizer": tok_status,
                  "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        atomic_write_json(tmp / RECORD, result)
        _fsync_tree(tmp)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result = {"path": os.path.relpath(out, run_dir) if out.resolve().is_relative_to(run_dir.resolve())
              else str(out.resolve()), **result}
    if record:
        record_in_run_json(run_dir, result)
    return result


def _tokenizer(run_dir: Path, cfg: Config, tmp: Path, warn) -> tuple[dict, object]:
    """Save the run's tokenizer into `tmp` (also creates `tmp`); (status record, TokenizerInfo or None)."""
    tmp.mkdir()
    try:
        info = tokenizer_info(run_dir, cfg)
        hf_tokenizer.save(info, tmp)
    except PretokError as e:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            with contextlib.suppress(FileNotFoundError):
                (tmp / name).unlink()
        warn(f"warning: {e}: the model is exported without a tokenizer (use the run's tokenizer with pretok)")
        return {"exported": False, "error": str(e)}, None
    return {"exported": True, "spec": info.spec, "kind": info.kind, "fingerprint": info.fingerprint}, info


def _replace(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`. An existing `out` is swapped with `tmp` in one step (renameat2 RENAME_EXCHANGE)
    and then removed; where the file system cannot swap, it is renamed aside first (a kill between the two
    renames leaves it as .old-<name>-<pid>)."""
    if out.exists() and not _exchange(tmp, out):
        old = out.parent / f".old-{out.name}-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    elif not out.exists():
        os.replace(tmp, out)
    shutil.rmtree(tmp, ignore_errors=True)      # the previous export, after a swap
    checkpoint._fsync_dir(out.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def record_in_run_json(run_dir: Path, result: dict) -> None:
    """run.json's "export" := `result`, unless the run is still running (its trainer rewrites run.json)."""
    info = _read_json(run_dir / "run.json")
    if info is None or info.get("status") == "running":
        return
    atomic_write_json(run_dir / "run.json", {**info, "export": result})
