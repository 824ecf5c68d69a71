"""The engine: input units → worker pool (tokenize, write one part each) → committed parts → final files + manifest.

Read top to bottom: `run_tokenize` plans units, prepares the output directory (refusing a different config,
resuming the same one), checks the tokenizer backend on a sample of the real input, tokenizes pending units in
worker processes and finally assembles the format's files and writes manifest.json last.

Crash safety: a part is written through temp names and *committed* by an atomically renamed
`.pretok/parts/part-NNNNNN.json`; anything without a commit record is deleted on the next run. Because units are
planned independently of the worker count and each part depends only on its unit, the final bytes are identical
for any number of workers, any interruption, and any sharding followed by `pretok merge`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..datapaths import window
from ..errors import PretokError, os_error
from ..formats import checksum
from ..formats.manifest import Policy, format_policy, read_manifest
from ..machine.memory import cpu_seconds
from ..sources import (InputFile, SourceOptions, Unit, check_stamps, estimate_text_bytes, expand_inputs, plan_units,
                       sample_texts, shard_units)
from ..sources.input_checks import check_skipped
from ..sources.remote import is_url, schemes
from ..tokenizer import TokenizerInfo, backends_for, id_dtype_for, load_tokenizer, select_backend
from ..tokenizer.specials import policy_id
from .boundaries import boundary_warnings, empty_shards_warning
from .config import TokenizeConfig
from .finalize import Plan, finalize
from .memmap_place import MemmapAssembler
from .outdir import (committed_parts, output_lock, prepare_output, recorded_part_bytes, refuse_overlap, remove_output,
                     resolve_output)
from .parts import KEEP_DEFAULTS, PART_HASH_KEY, STATE, Job, PartRecord, keep_limit, part_files_intact, part_hashes
from .progress import Progress
from .workers import Stopped, Work, Workers

MEMMAP_PREFIX = "data"


def resolve_policy(info: TokenizerInfo, cfg: TokenizeConfig) -> Policy:
    """The explicit BOS/EOS/padding/dtype policy recorded in the manifest and the output key; `seq_len` and
    `row_length` only for `padded`, the one format whose bytes depend on them."""
    bos, eos = policy_id(info, "bos", cfg.bos), policy_id(info, "eos", cfg.eos)
    needed = id_dtype_for(info.vocab_size)
    dtype = needed if cfg.dtype == "auto" else cfg.dtype
    if dtype not in ("uint16", "int32"):
        raise PretokError(f"unknown --dtype {dtype} (auto, uint16 or int32)")
    if dtype == "uint16" and needed != "uint16":
        raise PretokError(f"--dtype uint16 cannot hold the ids of {info.spec} (vocab {info.vocab_size} > 65536); "
                          "use --dtype int32 or auto")
    pad = info.pad_id if info.pad_id is not None else (info.eos_id if info.eos_id is not None else 0)
    return format_policy(cfg.format, {
        "bos_id": bos, "eos_id": eos, "pad_id": pad, "dtype": dtype, "seq_len": cfg.seq_len,
        "row_length": window(cfg.seq_len), "truncation": "right (padded format only)",
        "special_tokens_in_text": "encoded as ordinary text", "bad_docs": cfg.bad_docs})


# ---------------------------------------------------------------- one unit → one committed part (worker side)


# ---------------------------------------------------------------- output directory: lock, config, resume


def _output_key(cfg: TokenizeConfig, sopts: SourceOptions, info: TokenizerInfo, policy: Policy, inputs: list,
                units: list[Unit]) -> dict:
    return {"format": cfg.format, "tokenizer_fingerprint": info.fingerprint, "policy": policy,
            "compression": cfg.compression if cfg.format != "memmap" else None,
            "text_column": cfg.text_column, "separator": cfg.separator, "part_bytes": sopts.part_bytes,
            "batch_mb": cfg.batch_mb, "inputs": inputs, "num_shards": cfg.num_shards,
            "shard_index": cfg.shard_index, "units": [u.index for u in units]}


# ---------------------------------------------------------------- the run


def input_checksum(path: str, algorithm: str = checksum.BLOCKS) -> str:
    """The checksum a manifest records for a local input (`formats.checksum`: by default the tree over its 64 MiB
    blocks; an HF dataset directory: over its files' blocks in sorted order). Earlier versions recorded a flat
    hash of the bytes (a directory: of its files' bytes in sorted order), still computed to verify those."""
    if algorithm == checksum.BLOCKS or not os.path.isdir(path):
        return checksum.of_file(path, algorithm)
    h = checksum.hasher(algorithm)
    for f in sorted(q for q in Path(path).rglob("*") if q.is_file()):
        with open(f, "rb") as fh:
            while block := fh.read(8 << 20):
                h.update(block)
    return checksum.value(h, algorithm)


class InputHashes:
    """The inputs' checksums, from the leaves of their blocks hashed by the workers (`Work.blocks`)."""

    def __init__(self, paths: list[str]):
        self.owners = [(p, b) for p in paths for b in checksum.block_ranges(p)]
        self.blocks = [b for _, b in self.owners]
        self.leaves: list[checksum.Leaf | None] = [None] * len(self.blocks)

    def add(self, k: int, leaf: checksum.Leaf) -> None:
        self.leaves[k] = leaf

    def values(self) -> dict[str, str]:
        by_path: dict[str, list] = {}
        for (p, _), leaf in zip(self.owners, self.leaves):
            assert leaf is not None, "an input block was never hashed"
            by_path.setdefault(p, []).append(leaf)
        return {p: checksum.tree_value(leaves, checksum.BLOCKS) for p, leaves in by_path.items()}


def run_tokenize(cfg: TokenizeConfig, _rejected: dict[str, str] | None = None, _t0: float | None = None) -> dict:
    """Pretokenize `cfg.inputs` into `cfg.out`; returns the manifest. Resumes an interrupted identical run.
    `_rejected`: why a restart's earlier run rejected other backends (kept in the manifest). `_t0`: when the run
    started (`time.time()`; default: now); the command line passes its process start, so that the manifest's wall
    time and start-up count the interpreter and the imports too."""
    cfg.check()
    for name in KEEP_DEFAULTS:  # a bad PRETOK_KEEP_* is one line here, not a worker's failure
        keep_limit(name)
    if is_url(cfg.out):
        raise PretokError("outputs must be on a POSIX file system (a local or mounted path): runs stay crash-safe "
                          "by atomic renames, which object stores lack", cfg.out)
    t0, cpu0 = _t0 or time.time(), cpu_seconds()
    out = resolve_output(cfg.out)
    if cfg.workers > 0 and multiprocessing.current_process().daemon:
        # a Pool or DataLoader worker may not start processes (multiprocessing asserts): the same bytes, inline
        print(f"pretok: warning: {out}: run_tokenize in a daemonic process (a multiprocessing Pool worker) cannot "
              f"start {cfg.workers} worker processes; tokenizing in this process (workers=0)", file=sys.stderr)
        cfg = TokenizeConfig(**{**cfg.__dict__, "workers": 0})
    rejected = dict(_rejected or {})
    # before the lock file is made beside `out` (globs are checked once expanded, in `_run`)
    refuse_overlap(out, [s for s in cfg.inputs if not is_url(s) and os.path.lexists(s)], "input")
    try:
        with output_lock(out):  # before anything under `out` is read or changed; held across an --overwrite
            while True:
                # The worker processes start first: their start-up (interpreter, imports, building the encoder)
                # overlaps the planning and tokenizer loading below. Not when the output is complete already.
                start = cfg.workers > 0 and not _complete_already(cfg, out)
                n = cfg.workers if start else 0
                with Workers(cfg.tokenizer, cfg.backend, n, schemes(cfg.inputs)) as workers:
                    restart = _run(cfg, (t0, cpu0), out, workers, rejected)
                if restart is None:
                    return read_manifest(out)
                remove_output(out)  # the fast guess failed the check: drop what it made, rerun with the checked one
                rejected = {**rejected, **restart.rejected}
                cfg = TokenizeConfig(**{**cfg.__dict__, "backend": restart.backend})
    except OSError as e:  # disk full, read-only file system, ...: one line naming the file (else the output)
        raise os_error(e, out) from None


def _complete_already(cfg: TokenizeConfig, out: Path) -> bool:
    """Whether the run may find its output complete (then it needs no encoder; `prepare_output` decides)."""
    return not cfg.overwrite and (out / "manifest.json").exists()


def _run(cfg: TokenizeConfig, start: tuple[float, float], out: Path, workers: Workers, rejected: dict[str, str]):
    """Plan, prepare the output, tokenize what is pending and finalize; returns None when the output is complete,
    else the check's BackendChoice to restart with (it rejected the backend the workers started with). `start`:
    when the run started (`time.time()`) and this process's CPU seconds then."""
    t0, cpu0 = start
    files = expand_inputs(cfg.inputs, output=out)
    refuse_overlap(out, [f.path for f in files if not is_url(f.path)], "input")  # before anything is deleted
    # an output already there keeps the part size it was planned with (`TokenizeConfig.planned_part_bytes`)
    sopts = cfg.source_options(estimate_text_bytes(files, cfg.text_column), recorded_part_bytes(out))
    units = plan_units(files, sopts)
    if not units:  # empty files, zero-row tables: before anything is written
        check_skipped(0, {}, cfg.max_bad_fraction, cfg.inputs[0] if len(cfg.inputs) == 1 else None)
    mine = shard_units(units, cfg.num_shards, cfg.shard_index)
    hashes = InputHashes(sorted({p for u in mine for p in u.paths if not is_url(p)}))  # URLs: their identity
    workers.expect(len(mine) + len(hashes.blocks))  # before the zygote forks (it is building the encoder)
    info = load_tokenizer(cfg.tokenizer)
    policy = resolve_policy(info, cfg)
    inputs = [f.record() for f in files]
    key = _output_key(cfg, sopts, info, policy, inputs, mine)
    # Optimistic start: workers tokenize with the fastest candidate that could be built (by the zygote, before
    # it forked; a failed build is recorded, never retried elsewhere) while the check of that choice on a sample
    # of this input runs beside them; if the check picks another backend, everything made with the first one
    # is discarded and the run starts over with the checked backend. Known before the output is touched: a
    # tokenizer no backend can build leaves no output behind.
    guess = None if _complete_already(cfg, out) else workers.backend(info, cfg.backend)
    if prepare_output(out, key, cfg.overwrite):
        return None
    done = committed_parts(out, mine)
    assembler, placements = None, []
    if cfg.format == "memmap":
        assembler = MemmapAssembler(out, out / STATE, MEMMAP_PREFIX, policy["dtype"], [u.index for u in mine])
        placements = _resume_places(assembler, out, done)
    pending = [u for u in mine if u.index not in done]
    job = Job(cfg.format, policy, cfg.compression, sopts, str(out), info,
              stamps=tuple(f.stamp() for f in files if not is_url(f.path)))
    records, last_record = dict(done), [t0]

    def on_record(rec: PartRecord) -> list:
        last_record[0] = time.time()
        records[rec["unit"]["index"]] = rec
        if assembler is None:
            return []
        return assembler.add(rec["unit"]["index"], rec["tokens"], rec["documents"], rec[PART_HASH_KEY])

    work = Work(pending, hashes.blocks, guess, job, info, on_record, hashes.add,
                assembler.done if assembler is not None else lambda p: None, placements)
    stop_check = threading.Event()
    remote = {b: e for b in backends_for(info) if (e := workers.encoder(b, stop_check)) is not None}
    check = _BackendCheck(info, lambda: sample_texts(mine, sopts), cfg.backend, remote)
    bar = Progress(sum(u.est_bytes for u in pending), f"{cfg.format} {len(pending)}/{len(mine)} parts",
                   enabled=cfg.progress)
    try:
        # The backend check starts once the workers can run: until then, the CPU is the zygote's (building the
        # encoder), which is what the first batch waits for. Placements known from a resume go out first.
        check.start(guess)
        workers.run(work, bar, check.raise_if_other)
        try:
            choice = check.result()
        except PretokError:  # its encoder ran in the zygote: a worker that died (the zygote exits with it) is
            workers.check_alive(wait=0.5)  # the cause, not the check (an idle worker killed as the last parts ended)
            raise
        choice.rejected = {**rejected, **choice.rejected}
    except BaseException as e:
        stop_check.set()
        check.join()  # select_backend runs in C: let it end before any interpreter exit
        bar.close(ok=False)
        if assembler is not None:
            assembler.close()
        if not isinstance(e, _OtherBackend):
            if isinstance(e, (PretokError, OSError)):   # a read that failed anywhere (a worker, the backend check's
                check_stamps(job.stamps)                # sample, the checksums) because an input changed: say so
            raise
        return e.choice
    bar.close()
    check_stamps(job.stamps)  # after the checksums were read: a change since planning fails the run
    _check_unchanged(cfg.inputs, files)
    files = assembler.finish() if assembler is not None else None
    # where the wall time went: start-up until the first batch was tokenized, tokenizing, then finishing
    first = bar.first_update or last_record[0]
    timeline = {"startup_seconds": round(first - t0, 3), "tokenize_seconds": round(last_record[0] - first, 3),
                "finish_seconds": round(time.time() - last_record[0], 3),
                **_cpu_accounts(cpu0, bar.first_update_cpu, [records[i] for i in records if i not in done],
                                inline=workers.n == 0), "workers_started": workers.started}
    plan = Plan(cfg, sopts, out, info, policy, mine, inputs, len(units), t0)
    manifest = finalize(plan, choice, records, hashes.values(), files, timeline)
    for line in filter(None, [empty_shards_warning(str(out), units, cfg.num_shards),
                              *boundary_warnings(str(out), manifest)]):
        print(line, file=sys.stderr, flush=True)
    return None


def _check_unchanged(specs: list[str], planned: list[InputFile]) -> None:
    """Refuse to finish a run whose remote inputs changed while it read them: their listing now must match the one
    planned from (local inputs: `check_stamps`)."""
    urls = [s for s in specs if is_url(s)]
    if not urls:
        return
    now = {f.path: f.record() for f in expand_inputs(urls)} if urls else {}
    for f in planned:
        if is_url(f.path) and now.get(f.path) != f.record():
            was = f"{f.size} bytes, {dict(f.version)}"
            is_ = "gone" if f.path not in now else f"{now[f.path]['size']} bytes, {now[f.path]['version']}"
            raise PretokError(f"changed while it was being read (planned from {was}; now {is_}); rerun with "
                              "--overwrite", f.path)


class _OtherBackend(Exception):
    def __init__(self, choice):
        self.choice = choice


class _BackendCheck:
    """`select_backend` in a thread beside the workers; `raise_if_other` stops the run if it picks another."""

    def __init__(self, info: TokenizerInfo, sample: Callable[[], list[str]], force: str | None,
                 remote: dict[str, Callable]):
        """`remote`: candidates' encode_batch run by the zygote (no second build in this process; one whose build
        failed there raises that failure). `start(guess)` runs it, once the zygote has told which backend the
        workers run."""
        self.guess, self.choice, self.error = None, None, None
        self.encoders = remote
        self.thread = threading.Thread(target=self._run, args=(info, sample, force), daemon=True)

    def start(self, guess: str) -> None:
        self.guess = guess
        self.thread.start()

    def join(self) -> None:
        if self.thread.is_alive():
            self.thread.join()

    def _run(self, info, sample, force) -> None:
        try:
            self.choice = select_backend(info, sample(), force, self.encoders)
        except BaseException as e:  # re-raised in the main thread
            self.error = e

    def raise_if_other(self) -> None:
        if self.error is not None and not isinstance(self.error, Stopped):  # Stopped: the pool's own failure,
            raise self.error  # which the run reports itself
        if self.choice is not None and self.choice.backend != self.guess:
            raise _OtherBackend(self.choice)

    def result(self):
        self.join()
        self.raise_if_other()
        if self.choice is None:
            raise PretokError("the tokenizer backend check could not finish (its worker process died); rerun the "
                              "same command to resume")
        return self.choice


def _resume_places(assembler: MemmapAssembler, out: Path, done: dict[int, PartRecord]) -> list:
    """After a crash: keep the logged placements whose bytes are intact (re-read); hand the assembler the sizes of
    every part with a record whose data survives (placed, or its own files intact), and forget the rest, so they
    are tokenized again. Returns the placements that can be done at once (parts finished but not placed)."""
    logged, ready = assembler.logged(), []
    for i in sorted(done):
        prefix = out / STATE / "parts" / done[i]["part"]
        hashes = part_hashes(done[i])
        kept = i in logged and hashes is not None and assembler.keep_placed(i, done[i]["tokens"],
                                                                            done[i]["documents"], hashes, logged[i])
        if kept:  # a crash between the placing and the deletion of the part's files
            for ext in (".bin", ".lens"):
                prefix.with_name(prefix.name + ext).unlink(missing_ok=True)
        elif not part_files_intact(prefix, done[i], assembler.itemsize):  # parts are not fsynced: check them
            (out / STATE / "parts" / f"{done.pop(i)['part']}.json").unlink()
            for ext in (".bin", ".lens"):
                prefix.with_name(prefix.name + ext).unlink(missing_ok=True)
            continue
        ready += assembler.add(i, done[i]["tokens"], done[i]["documents"], hashes)
    assembler.restart_log()
    return ready


def _cpu_accounts(cpu0: float, first_cpu: float | None, tokenized: list[PartRecord], inline: bool) -> dict:
    """Where the CPU went (issue 37): `workers_cpu_seconds` on the parts tokenized by this run, `main_cpu_seconds`
    of the main process since the run started (planning, input checksums, the memmap appends, index, manifest)
    and `main_cpu_streaming_seconds` of it from the first batch on (its per-byte share). With no workers
    (`inline`) the parts were tokenized in the main process: their CPU is taken out of its accounts."""
    now, workers_cpu = cpu_seconds(), sum(float(r.get("cpu_seconds", 0.0)) for r in tokenized)
    own = workers_cpu if inline else 0.0
    return {"workers_cpu_seconds": round(workers_cpu, 3), "main_cpu_seconds": round(max(0.0, now - cpu0 - own), 3),
            "main_cpu_streaming_seconds": round(max(0.0, now - (first_cpu if first_cpu is not None else cpu0) - own),
                                                3)}
