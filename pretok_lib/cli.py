"""The `pretok` command line: parses arguments and calls one library function per subcommand; no logic here."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from .errors import PretokError
from .exits import READER_GONE, Terminated, at_boundary, escape_unencodable_output, reader_gone
from .machine.cpu_affinity import usable_cpus


def _env_int(name: str, fallback: int) -> int:
    """An integer environment variable (or `fallback` if unset); anything else is a one-line error naming it."""
    raw = os.environ.get(name)
    if raw is None:
        return fallback
    try:
        return int(raw.strip())
    except ValueError:
        raise PretokError(f"{name}={raw!r} is not an integer (set by SLURM for job arrays; "
                          "unset it or pass --num-shards/--shard-index)") from None


def _slurm_default(name: str, fallback: int) -> int:
    """Shard count/index default from a SLURM job array (index relative to the array's first task id)."""
    if name == "count":
        return _env_int("SLURM_ARRAY_TASK_COUNT", fallback)
    if "SLURM_ARRAY_TASK_ID" not in os.environ:
        return fallback
    return _env_int("SLURM_ARRAY_TASK_ID", fallback) - _env_int("SLURM_ARRAY_TASK_MIN", 0)


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _add_tokenize_args(p: argparse.ArgumentParser) -> None:
    """`pretok tokenize`'s options; every default is `TokenizeConfig`'s (engine/config.py), never restated."""
    from .engine.config import CHOICES, FORMATS, MAX_PART_BYTES, MIN_PART_BYTES, PARTS_MEMMAP, PARTS_PARQUET, default

    p.add_argument("inputs", nargs="+", metavar="INPUT", help="parquet/jsonl(.gz,.zst)/txt files, globs, HF dataset dirs")
    p.add_argument("--out", required=True, help="output directory (data files + manifest.json)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, dir, .model, .tiktoken, tekken JSON or hub name")
    p.add_argument("--format", default=default("format"), choices=FORMATS)
    p.add_argument("--seq-len", type=int, default=default("seq_len"),
                   help="padded rows hold seq_len+1 tokens (padded only: token-list and memmap ignore it)")
    p.add_argument("--workers", type=int, default=default("workers"),
                   help="worker processes (0 = inline; default: the CPUs this process may use)")
    p.add_argument("--text-column", default=default("text_column"), help="parquet column / JSON key holding the text")
    p.add_argument("--separator", default=default("separator"),
                   help="txt inputs: regex splitting a file into documents, as re.split on the whole file (groups "
                        "are not documents; a match and its look-arounds within 64 Ki characters)")
    p.add_argument("--compression", default=default("compression"),
                   help="parquet formats: none, snappy, zstd[:level], ...")
    p.add_argument("--dtype", default=default("dtype"), choices=CHOICES["dtype"])
    p.add_argument("--bos", default=default("bos"), choices=CHOICES["bos"],
                   help="prepend BOS (auto: if defined)")
    p.add_argument("--eos", default=default("eos"), choices=CHOICES["eos"], help="append EOS to every document")
    p.add_argument("--bad-docs", default=default("bad_docs"), choices=CHOICES["bad_docs"],
                   help="null / non-string / empty / invalid UTF-8 documents: skip and count, or fail")
    p.add_argument("--max-bad-fraction", type=_fraction, default=default("max_bad_fraction"),
                   help="fail the run (no manifest) if more than this fraction of documents was skipped; "
                        f"1 allows any (default {default('max_bad_fraction')})")
    p.add_argument("--backend", default=default("backend"),
                   help="force a tokenizer backend (still checked against the reference)")
    p.add_argument("--num-shards", type=int, default=None,
                   help=f"default: SLURM_ARRAY_TASK_COUNT or {default('num_shards')}")
    p.add_argument("--shard-index", type=int, default=None,
                   help=f"default: SLURM_ARRAY_TASK_ID or {default('shard_index')}")
    p.add_argument("--part-mb", type=float, default=default("part_mb"),
                   help=f"text MB per part, the unit of work and of resume (default: the input's text/{PARTS_MEMMAP} "
                        f"within [{MIN_PART_BYTES['memmap'] / 1e6:g}, {MAX_PART_BYTES / 1e6:g}] for memmap, "
                        f"text/{PARTS_PARQUET} within [1, {MAX_PART_BYTES / 1e6:g}] for the parquet formats)")
    p.add_argument("--batch-mb", type=float, default=default("batch_mb"),
                   help="input MB tokenized per batch (bounds memory; 1 MB stays in CPU caches)")
    p.add_argument("--overwrite", action="store_true", help="replace an output directory holding another config")
    p.add_argument("--no-progress", action="store_true")


def tokenize_config(a: argparse.Namespace):
    from .engine.config import TokenizeConfig, default

    return TokenizeConfig(
        inputs=a.inputs, out=a.out, tokenizer=a.tokenizer, format=a.format, seq_len=a.seq_len, workers=a.workers,
        text_column=a.text_column, separator=a.separator, compression=a.compression, dtype=a.dtype, bos=a.bos,
        eos=a.eos, bad_docs=a.bad_docs, max_bad_fraction=a.max_bad_fraction, backend=a.backend,
        num_shards=a.num_shards if a.num_shards is not None else _slurm_default("count", default("num_shards")),
        shard_index=a.shard_index if a.shard_index is not None else _slurm_default("index", default("shard_index")),
        part_mb=a.part_mb, batch_mb=a.batch_mb, overwrite=a.overwrite, progress=not a.no_progress)


def cmd_corpus(a: argparse.Namespace) -> None:
    from .demo.corpus import build_corpus

    info = build_corpus(a.out, max_mb=a.max_mb, packages=a.packages)
    print(json.dumps(info.to_dict(), indent=2))


def cmd_tokenize(a: argparse.Namespace) -> None:
    from .engine.spawn import discard_early, start_early
    from .sources.remote import schemes

    cfg = tokenize_config(a)
    # the zygote starts before this process imports the engine (numpy, pyarrow: ~0.15 s); the run takes it over
    if cfg.workers > 0 and (cfg.overwrite or not (Path(cfg.out) / "manifest.json").exists()):
        start_early(cfg.tokenizer, cfg.backend, cfg.workers, schemes(cfg.inputs))
    try:
        from .engine.verify import format_inspect, inspect
        from .pretokenize import run_tokenize

        run_tokenize(cfg, _t0=_STARTED)
    finally:
        discard_early()
    print(format_inspect(inspect(a.out)))


def process_start_time() -> float:
    """When this process started, as time.time() (Linux: from /proc, 10 ms resolution; elsewhere: now)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def cmd_merge(a: argparse.Namespace) -> None:
    from .engine.merge import merge_shards
    from .engine.verify import format_inspect, inspect

    merge_shards(a.shards, a.out, overwrite=a.overwrite)
    print(format_inspect(inspect(a.out)))


def cmd_inspect(a: argparse.Namespace) -> None:
    from .engine.verify import format_inspect, inspect

    report = inspect(a.dir)
    print(json.dumps(report["stats"], indent=2) if a.json else format_inspect(report))


def cmd_verify(a: argparse.Namespace) -> None:
    from .engine.verify import verify

    rep = verify(a.dir, sources=a.source, sample=a.sample, seed=a.seed)
    print(f"{a.dir}: {rep.files_checked} files checksummed; {rep.documents_checked} sampled documents "
          f"re-tokenized from source: {rep.ids_equal} identical ids, {rep.text_roundtrip_equal} decode to the exact "
          f"source text")
    if not rep.ok:
        raise PretokError("; ".join(rep.problems[:3]) + (f" (+{len(rep.problems) - 3} more)" if len(rep.problems) > 3 else ""))


def cmd_demo(a: argparse.Namespace) -> None:
    from .demo.run import run_demo

    run_demo(Path(a.out), max_mb=a.max_mb, vocab_size=a.vocab_size, workers=a.workers)


def cmd_bench_tokenize(a: argparse.Namespace) -> None:
    from .bench.tokenize import main as bench_main

    bench_main(a)


def cmd_bench_loaders(a: argparse.Namespace) -> None:
    from .bench.loaders import main as bench_main

    bench_main(a)


def cmd_bench_train(a: argparse.Namespace) -> None:
    from .bench.train import main as bench_main

    bench_main(a)


def cmd_train(args) -> int:
    from .train.run import run_from_args

    return run_from_args(args)


def cmd_export(a: argparse.Namespace) -> None:
    from .train.export import export_run

    res = export_run(a.run_dir, out=a.out, step=a.step, overwrite=a.overwrite)
    where = Path(a.run_dir) / res["path"] if not Path(res["path"]).is_absolute() else Path(res["path"])
    tok = "model and tokenizer" if res["tokenizer"]["exported"] else "model only (no tokenizer)"
    print(f"{where}: step {res['step']} of {res['run_id']} exported, {tok}; "
          f"AutoModelForCausalLM.from_pretrained('{where}') loads it")


def cmd_sweep(a: argparse.Namespace) -> None:
    from .launch.sweep import Grid, dry_run_lines, parse_axis, parse_setting, run_sweep

    grid = Grid.from_yaml(a.grid) if a.grid else Grid()
    grid.axes.update(dict(parse_axis(x) for x in a.axis))
    grid.base.update(dict(parse_setting(x) for x in a.set))
    for item in a.path:
        kind, sep, path = item.partition("=")
        if not sep or not kind or not path:
            raise PretokError(f"--path '{item}' is not of the form KIND=PATH")
        grid.linked.setdefault("data", {})[kind.strip()] = {"data.path": path}
    grid.prefix = a.prefix or grid.prefix
    if a.dry_run:  # what the sweep would do with each point: its state, or why it would be refused
        for line in dry_run_lines(a.config, grid, a.runs_dir, a.launcher, a.module, a.rerun_changed):
            print(line)
        return
    res = run_sweep(a.config, grid, a.runs_dir, a.launcher, module=a.module, timeout_s=a.timeout,
                    changed="rerun" if a.rerun_changed else "refuse")
    failed = [p.run_id for p, s in res if s == "failed"]
    print(f"sweep: {sum(s == 'completed' for _, s in res)} completed now, {sum(s == 'skipped' for _, s in res)} "
          f"skipped (completed before), {len(failed)} failed; runs in {a.runs_dir}/")
    if failed:
        raise PretokError(f"{len(failed)} of {len(res)} grid points failed: {', '.join(failed)} "
                          f"(see <run>/launcher.log; rerun the same command to retry them)")


def cmd_study(a: argparse.Namespace) -> None:
    from .study import run_study

    run_study(a.profile, out=a.out, notebooks=a.notebooks, parameters=dict(_kv(x) for x in a.set),
              kernel=a.kernel)


def cmd_report(a: argparse.Namespace) -> None:
    from .analysis.runs_report import build_report

    res = build_report(a.runs_dir, a.out, target_loss=a.target_loss, bench=a.bench, png=a.png, title=a.title)
    print(f"{res['report']}: report of the runs in {a.runs_dir} ({len(res) - 1} figures beside it)")


def cmd_gpu_check(a: argparse.Namespace) -> int:
    from .bench.gpu_check import main

    return main(a)


def cmd_gpu_study(a: argparse.Namespace) -> int:
    from .bench.gpu_study import main

    return main(a)


def _kv(text: str) -> tuple[str, object]:
    from .launch.sweep import parse_setting

    return parse_setting(text)


DESCRIPTION = """\
pretok: pretokenize LLM training corpora once (parallel, resumable, crash-safe), load them at near-zero cost
in DDP training, and measure whether the data path is the bottleneck.

  pretok tokenize INPUTS --out DIR --tokenizer T --format memmap   # corpus -> dataset (+ manifest.json)
  pretok train --config configs/tiny.yaml                          # train on one data path (torchrun for DDP)
  pretok study --profile quick --out runs/study-quick              # the whole study: notebooks 01-05 + report
  pretok export runs/<id> --out DIR                                # a run as a transformers model directory
  pretok report runs/my-sweep                                      # figures + findings + HTML of any runs

Every subcommand has --help; the README and docs/ hold the contracts."""

SUBCOMMANDS_LIGHT = ("corpus", "tokenize", "merge", "inspect", "verify", "demo", "sweep", "study", "gpu-check",
                     "gpu-study", "export", "report")


class _Parser(argparse.ArgumentParser):
    """Argument errors in one line, as every other error (argparse prints its usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _choices(command: str | None, subcommand: str, name: str) -> list[str] | None:
    """The choices of an option of `subcommand`: the names its module declares (sweep.LAUNCHERS,
    study.profiles.PROFILES), imported only when that subcommand (or any, `command` None) may be parsed."""
    if command not in (None, subcommand):
        return None
    import importlib

    module = {"sweep": ".launch.sweep", "study": ".study.profiles"}[subcommand]
    return list(getattr(importlib.import_module(module, __package__), name))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; `command` (the subcommand about to run, if known) spares the others' heavy imports: the
    `train` and `bench` arguments live next to code that imports torch, which `pretok tokenize` does not need."""
    heavy = command is None or command not in SUBCOMMANDS_LIGHT
    from . import __version__

    ap = _Parser(prog="pretok", description=DESCRIPTION,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"pretok {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("corpus", help="build the embedded default corpus (Python sources + docstrings) as parquet")
    p.add_argument("--out", required=True)
    p.add_argument("--max-mb", type=_positive, default=50.0)
    p.add_argument("--packages", nargs="*", default=None, help="installed packages to add after the stdlib")
    p.set_defaults(fn=cmd_corpus)
    p = sub.add_parser("tokenize", help="pretokenize inputs into padded / token-list / memmap")
    _add_tokenize_args(p)
    p.set_defaults(fn=cmd_tokenize)
    p = sub.add_parser("merge", help="merge shard outputs into one dataset")
    p.add_argument("shards", nargs="+", metavar="SHARD_DIR")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(fn=cmd_merge)
    p = sub.add_parser("inspect", help="manifest summary and statistics")
    p.add_argument("dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser("verify", help="checksums + re-tokenize a sample from the source and compare")
    p.add_argument("dir")
    p.add_argument("--source", nargs="+", default=None, help="the inputs, if they moved since pretokenization")
    p.add_argument("--sample", type=_count, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("demo", help="the main job on the embedded default corpus and tokenizer")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--max-mb", type=_positive, default=20.0)
    p.add_argument("--vocab-size", type=_count, default=8192)
    p.add_argument("--workers", type=_count, default=usable_cpus())
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("train", help="train a causal LM on one data path (torchrun for DDP); see docs/RUNS.md")
    if heavy:
        from .train.run import add_args as add_train_args

        add_train_args(p)
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("export", help="a run's checkpoint as a transformers model directory (config + safetensors "
                       "+ tokenizer) that AutoModelForCausalLM / AutoTokenizer load offline; see docs/RUNS.md")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `pretok train` run directory (runs/<id>)")
    p.add_argument("--out", default=None, help="output directory (default: RUN_DIR/hf)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this step (default: the newest)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out holding only an export's files but "
                   "no pretok_export.json (never one holding other files)")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("sweep", help="a grid of training runs, one process (or SLURM job) per point, resumable")
    p.add_argument("--config", required=True, help="training config YAML (e.g. configs/tiny.yaml)")
    p.add_argument("--grid", default=None, help="YAML with axes / base / linked / prefix")
    p.add_argument("--axis", action="append", default=[], metavar="KEY=V1,V2",
                   help="an axis: world, data, micro_batch, precision, lr, seq_len or any dotted config key")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every point")
    p.add_argument("--path", action="append", default=[], metavar="KIND=PATH",
                   help="data.path of one data path (text inputs for padded/padding-free, a pretok output dir else)")
    p.add_argument("--prefix", default=None, help="run id prefix (default: sweep)")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--launcher", default="local", choices=_choices(command, "sweep", "LAUNCHERS"))
    p.add_argument("--timeout", type=_positive, default=None, help="seconds per local run before it is stopped")
    p.add_argument("--rerun-changed", action="store_true",
                   help="start over a point whose run directory holds a run of another config (default: refuse it)")
    p.add_argument("--dry-run", action="store_true", help="print run ids, their status and commands (--launcher "
                   "slurm: each point's full sbatch line); run or submit nothing")
    p.add_argument("--module", default="pretok_lib.train", help=argparse.SUPPRESS)  # tests use a stand-in trainer
    p.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("study", help="execute notebooks 01-05 (papermill) and export the HTML report; notebooks and "
                       "configs from the current project (with notebooks/), else those installed with pretok")
    p.add_argument("--profile", default="quick", choices=_choices(command, "study", "PROFILES"),
                   help="quick: 2 CPU cores, ~10 min; full: real hardware (GPUs); smoke: ~1 min check")
    p.add_argument("--out", default=None, help="the study directory, the only place it writes (default: "
                   "runs/study-<profile> of the current project, else of the current directory)")
    p.add_argument("--notebooks", nargs="*", default=None, help="a subset, e.g. 01 02 (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="notebook parameter for every notebook that has it (YAML value)")
    p.add_argument("--kernel", default="pretok", help="Jupyter kernel (registered in the venv if missing)")
    p.set_defaults(fn=cmd_study)
    p = sub.add_parser("report", help="figures, findings and an HTML report for any runs directory (a custom sweep, "
                       "pretok_lib.measure runs, ...); see docs/BYO.md")
    p.add_argument("runs_dir", help="directory holding run directories (searched recursively)")
    p.add_argument("--out", default=None, help="default: RUNS_DIR/report")
    p.add_argument("--target-loss", type=_positive, default=None, help="time-to-target loss (default: from the runs)")
    p.add_argument("--bench", default=None, help="a `pretok bench tokenize --json` result (tokenization figure)")
    p.add_argument("--png", action="store_true", help="also write PNGs (needs Chromium)")
    p.add_argument("--title", default=None)
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("gpu-check", help="acceptance of a GPU machine: DDP/NCCL, bf16, compile, kill + resume, smoke "
                       "study; prints a JSON verdict (docs/GPU_CHECK.md)")
    if command in (None, "gpu-check"):  # its module and gpu-study's import torch (via the benches)
        from .bench.gpu_check import add_args as add_gpu_check_args

        add_gpu_check_args(p)
    p.set_defaults(fn=cmd_gpu_check)
    p = sub.add_parser("gpu-study", help="the study's model (MFU), the five data paths (measured vs predicted stall) "
                       "and the engine's scaling on a GPU machine, in one budget; one JSON (docs/GPU_CHECK.md)")
    if command in (None, "gpu-study"):
        from .bench.gpu_study import add_args as add_gpu_study_args

        add_gpu_study_args(p)
    p.set_defaults(fn=cmd_gpu_study)
    bench = sub.add_parser("bench", help="benchmarks that print tables and ratios measured in one run")
    if heavy:
        bsub = bench.add_subparsers(dest="bench", required=True)
        p = bsub.add_parser("tokenize", help="tokenization: on-the-fly loop vs datasets.map vs backend ceiling vs engine")
        from .bench.tokenize import add_args

        add_args(p)
        p.set_defaults(fn=cmd_bench_tokenize)
        p = bsub.add_parser("loaders", help="loader-only throughput of the five data paths vs the raw memmap ceiling")
        from .bench.loaders import add_args as add_loader_args

        add_loader_args(p)
        p.set_defaults(fn=cmd_bench_loaders)
        p = bsub.add_parser("train", help="training throughput of the five data paths (effective tok/s, data stall)")
        from .bench.train import add_args as add_train_bench_args

        add_train_bench_args(p)
        p.set_defaults(fn=cmd_bench_train)
    return ap


__all__ = ["Terminated", "build_parser", "main", "script", "tokenize_config"]  # Terminated: exits.py's, kept here
SIGTERM_OWN = (["train"],)  # left to the trainer, which checkpoints on SIGTERM (train/loop.py)


def main(argv: list[str] | None = None, *, script: bool = False) -> int:
    """Run one subcommand at the error boundary (exits.py: one-line errors, exit codes, SIGTERM taken by every
    subcommand but train, whose trainer checkpoints on it)."""
    argv = sys.argv[1:] if argv is None else argv

    def run() -> int | None:
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        return args.fn(args)

    return at_boundary(run, take_sigterm=argv[:1] not in SIGTERM_OWN, script=script)


_STARTED: float | None = None  # when the `pretok` command's process started (None: main() called in-process)


def script() -> None:
    """The `pretok` command (and `python -m pretok_lib.cli`)."""
    global _STARTED
    _STARTED = process_start_time()
    escape_unencodable_output()
    if sys.argv[1:2] == ["train"]:
        from .train.collector import import_training_modules

        import_training_modules()  # as `python -m pretok_lib.train` does (train/collector.py)
    try:
        rc = main(script=True)
    except SystemExit as e:  # --help, --version
        rc = e.code
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # what was left in stdout's buffer found the pipe closed
        if reader_gone():
            rc = READER_GONE
    sys.exit(rc)


if __name__ == "__main__":
    script()
