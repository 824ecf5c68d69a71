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
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch

from ..atomic import atomic_write_json
from ..errors import PretokError
from ..formats.manifest import data_identity, read_manifest
from . import checkpoint, hf_tokenizer
from .config import Config, load_config
from .model import build_model
from .run_record import FILE as RUN_RECORD
from .run_record import read_run_record

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


# What an export writes (save_pretrained: sharded weights for a large model; hf_tokenizer.save)
EXPORT_FILE = re.compile(r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map)\.json|"
                         r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|" + re.escape(RECORD))


def refuse_foreign_files(out: Path, overwrite: bool) -> None:
    """An existing --out is replaced only when it is empty or holds nothing but an export's files: an earlier
    export (its pretok_export.json), or with --overwrite one without that record. Anything else in it (a directory,
    a file no export writes) is refused even with --overwrite: replacing `out` would delete it."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise PretokError("exists and is not a directory: --out names the export's directory", out)
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if not EXPORT_FILE.fullmatch(n) or (out / n).is_dir()]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise PretokError(f"exists and is not a pretok export (it holds {shown}, which an export does not write; "
                          "not replaced, even with --overwrite): export into a new or empty directory", out)
    if names and not overwrite and RECORD not in names:
        raise PretokError("exists and is not a pretok export (no pretok_export.json; use --overwrite to replace "
                          "it)", out)


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


class UnprovenTokenizer(PretokError):
    """No record proves which tokenizer made the run's data: the export is refused (a guess could pair the model
    with another dataset's vocabulary)."""


def tokenizer_info(run_dir: Path, cfg: Config, ckpt: Path | None = None):
    """The TokenizerInfo of the tokenizer the run's data was made with, checked against its recorded fingerprint:
    run.json's record; else (a run.json that is gone, or from before it named its tokenizer) the config's data,
    only when checkpoint `ckpt`'s loader state proves it is the data the run read (its recorded data identity).
    UnprovenTokenizer when neither proves one; PretokError when the proven one cannot be loaded or changed."""
    from ..tokenizer import load_tokenizer

    rec = (read_run_record(run_dir) or {}).get("tokenizer") or {}
    spec, fingerprint = rec.get("spec"), rec.get("fingerprint")
    if not (spec and fingerprint):
        spec, fingerprint = _proven_by_checkpoint(run_dir, cfg, ckpt)
    info = load_tokenizer(spec)
    if info.fingerprint != fingerprint:
        raise PretokError(f"tokenizer changed since the run's data was tokenized ({fingerprint[:19]}...)", spec)
    return info


def _proven_by_checkpoint(run_dir: Path, cfg: Config, ckpt: Path | None) -> tuple[str, str]:
    """(spec, fingerprint) of the config's pretokenized data (data.path or every mixture dataset) when `ckpt`'s
    loader state recorded exactly that data, else UnprovenTokenizer."""
    why = "run.json records no tokenizer (missing, unreadable or older)"
    kinds_ok = cfg.data.mixture or (cfg.data.kind.startswith("pretok-") and isinstance(cfg.data.path, str)
                                    and cfg.data.path)
    if not kinds_ok:
        raise UnprovenTokenizer(f"{why} and its data is not a pretokenized dataset whose manifest names one: the "
                                "tokenizer cannot be proven to be the run's; export refused", run_dir)
    try:
        manifests = [read_manifest(e.path) for e in cfg.data.mixture] or [read_manifest(cfg.data.path)]
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False) if ckpt else {}
        loader = dict(state.get("loader") or {})
    except PretokError as e:
        raise UnprovenTokenizer(f"{why} and the run's data cannot be read ({e}): the tokenizer cannot be proven to "
                                "be the run's; export refused", run_dir) from None
    except Exception as e:  # noqa: BLE001 - a damaged state.pt: one line
        raise UnprovenTokenizer(f"{why} and {ckpt}/state.pt cannot be read ({type(e).__name__}): the tokenizer "
                                "cannot be proven to be the run's; export refused", run_dir) from None
    if cfg.data.mixture:
        recorded = [e.get("data", e.get("manifest")) for e in loader.get("mixture") or []]
        now = [data_identity(m) if "data" in e else m.get("manifest_sha256")
               for m, e in zip(manifests, loader.get("mixture") or [])]
    else:
        recorded, now = [loader.get("data")], [data_identity(manifests[0])]
    if len(recorded) != len(manifests) or recorded != now:
        data = ", ".join(str(e.path) for e in cfg.data.mixture) or cfg.data.path
        raise UnprovenTokenizer(f"{why} and the config's data ({data}) is not the data its checkpoint recorded: the "
                                "tokenizer cannot be proven to be the run's; export refused", run_dir)
    tok = manifests[0]["tokenizer"]
    return cfg.data.tokenizer or tok["spec"], tok["fingerprint"]


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
    refuse_foreign_files(out, overwrite)
    model = load_model(cfg, ckpt)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tok_status, info = _tokenizer(run_dir, cfg, ckpt, tmp, warn)
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


def _tokenizer(run_dir: Path, cfg: Config, ckpt: Path, tmp: Path, warn) -> tuple[dict, object]:
    """Save the run's tokenizer into `tmp` (also creates `tmp`); (status record, TokenizerInfo or None)."""
    tmp.mkdir()
    try:
        info = tokenizer_info(run_dir, cfg, ckpt)
        hf_tokenizer.save(info, tmp)
    except UnprovenTokenizer:
        raise
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
    info = read_run_record(run_dir)
    if info is None or info.get("status") == "running":
        return
    atomic_write_json(run_dir / RUN_RECORD, {**info, "export": result})
