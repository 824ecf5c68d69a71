"""Facts with one home (issue 38): the format list, the codec grid and the training codec live in
`pretok_lib/formats/__init__.py`; every other module imports them. A literal restating one fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pretok_lib
from pretok_lib import formats
from pretok_lib.datapaths import FORMAT_OF

PKG = Path(pretok_lib.__file__).parent
HOME = PKG / "formats" / "__init__.py"
NOT_YET: set[Path] = set()  # files not yet taking their facts from the homes (none left)
FORMAT_TUPLE = re.compile(r'\(\s*"(?:memmap|token-list|padded)",\s*"(?:memmap|token-list|padded)",\s*'
                          r'"(?:memmap|token-list|padded)"\s*\)')


def _sources() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if p != HOME and p not in NOT_YET]


def test_the_training_codec_and_the_codec_grid_are_written_once() -> None:
    found = [f"{p.relative_to(PKG)}:{n}" for p in _sources()
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r'"zstd:(3|22)"', line)]
    assert not found, f"write formats.TRAIN_COMPRESSION / formats.CODEC_GRID, not the literal: {found}"


def test_the_format_list_is_written_once() -> None:
    found = [str(p.relative_to(PKG)) for p in _sources() if FORMAT_TUPLE.search(p.read_text())]
    assert not found, f"import formats.FORMATS instead of restating it: {found}"


def test_every_user_takes_the_formats_constants() -> None:
    from pretok_lib.bench import loaders, tokenize
    from pretok_lib.study import datasets, profiles

    assert tokenize.FORMATS is formats.FORMATS and datasets.FORMATS is formats.FORMATS
    assert loaders.COMPRESSIONS is formats.CODEC_GRID and profiles.CODECS == list(formats.CODEC_GRID)
    assert datasets.TRAIN_COMPRESSION == formats.TRAIN_COMPRESSION in formats.CODEC_GRID
    assert set(formats.FORMATS) == set(FORMAT_OF.values())


def test_the_loader_step_is_one_function_of_micro_batch_and_world() -> None:
    """`data/order.py` and `data/loader.py` take the samples of a loader step (micro-batch x ranks, without
    accumulation) from `order.step_samples`, itself `datapaths.global_batch` with one accumulation step."""
    from pretok_lib.data import loader, order
    from pretok_lib.datapaths import global_batch

    assert order.step_samples(8, 3) == global_batch(8, 3) == 24 and order.Shard(world=3, micro_batch=8).step_samples == 24
    assert loader.step_samples is order.step_samples
    for path in (PKG / "data" / "order.py", PKG / "data" / "loader.py"):
        assert not re.search(r"micro_batch \* (self\.)?world\b", path.read_text()), path


def test_the_skip_steps_default_and_the_precision_dtypes_are_declared_once() -> None:
    """`log.skip_steps`'s default is `train.config.SKIP_STEPS` wherever a summary leaves warm-up steps out; the
    precision -> dtype map is `train.hardware.DTYPES` (evaluation and the study's budget autocast through it)."""
    from pretok_lib.analysis import metrics
    from pretok_lib.train.config import SKIP_STEPS, LogConfig

    assert LogConfig().skip_steps == SKIP_STEPS and metrics.DEFAULT_SKIP == SKIP_STEPS
    skip = re.compile(r'skip(_steps)?: int = \d|"skip_steps", \d\)')
    dtype = re.compile(r'"(bf16|fp16)": torch\.')
    found = [f"{p.relative_to(PKG)}:{n}" for p in sorted(PKG.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if (skip.search(line) and "bench" not in p.parts) or (dtype.search(line) and p.name != "hardware.py")]
    assert not found, found


def test_the_cli_takes_its_choice_lists_from_their_modules() -> None:
    """`pretok sweep --launcher` and `pretok study --profile` offer the names sweep.py and study/profiles.py
    declare; `pretok tokenize --format`, `--dtype`, `--bos`, `--eos` and `--bad-docs` the engine config's (which
    `TokenizeConfig.check` enforces), `--format` being formats.FORMATS."""
    from pretok_lib.cli import build_parser
    from pretok_lib.engine.config import CHOICES
    from pretok_lib.engine.config import FORMATS as ENGINE_FORMATS
    from pretok_lib.launch.sweep import LAUNCHERS
    from pretok_lib.study.profiles import PROFILES

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")

    def choices(command: str, option: str) -> list:
        return next(a.choices for a in sub.choices[command]._actions if option in a.option_strings)

    assert choices("sweep", "--launcher") == list(LAUNCHERS) and choices("study", "--profile") == list(PROFILES)
    assert choices("tokenize", "--format") is ENGINE_FORMATS is formats.FORMATS
    for name, values in CHOICES.items():
        assert choices("tokenize", "--" + name.replace("_", "-")) is values, name


def test_the_cli_leaves_signals_and_exit_codes_to_exits_py() -> None:
    """cli.py parses and dispatches; the SIGTERM handler and the exit codes are exits.py's."""
    from pretok_lib import cli, exits

    text = (PKG / "cli.py").read_text()
    assert not re.search(r"^import (signal|threading)$|signal\.signal\(|return 1[34][0-9]$", text, re.MULTILINE)
    assert cli.Terminated is exits.Terminated and cli.READER_GONE == exits.READER_GONE == 141


def test_run_and_study_files_are_read_by_their_readers() -> None:
    """run.json and config.yaml (run_record.py), study.json (study/reporting.py) and
    manifest.json (formats.manifest.read_manifest): gpu_check.py, train/export.py and the analysis parse none of
    them themselves."""
    for rel in ("bench/gpu_check.py", "train/export.py", "analysis/metrics.py", "analysis/bench_tables.py"):
        text = (PKG / rel).read_text()
        assert not re.search(r'/ "(run|study|manifest)\.json"|config\.yaml"\)\.read_text|yaml\.safe_load', text), rel
