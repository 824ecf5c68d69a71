"""Shared fixtures: paths into ../shared/data (real corpora and tokenizers), never copied into the repo."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from pretok_lib.errors import PretokError

# No per-example wall-clock deadline in any property test (hypothesis's default, 200 ms, fails an example that a
# loaded machine merely slowed: a speed assumption, not a hang; 27 of the suite's @given tests had it).
settings.register_profile("pretok", deadline=None)
settings.load_profile("pretok")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# megatron-core imports torch.utils.cpp_extension → setuptools, whose distutils shim asserts after the corpus
# tests walked the stdlib with find_spec; the stdlib distutils is fine for an import-only use.
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")
# `make test` runs several test processes (pytest-xdist `-n $(TEST_WORKERS)`, set before this file loads): each
# computes on one thread, and so do the training runs and notebook kernels it starts. A second OpenMP thread per
# process only competes with the other test processes, spin-waiting (tests/bench/test_bench_train.py: 23% less
# CPU time).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PRETOK_SHARED_DATA", ROOT.parent / "shared" / "data"))
TOKENIZERS = SHARED / "tokenizers"
CORPORA = SHARED / "corpora"

GPT2_JSON = TOKENIZERS / "gpt2" / "tokenizer.json"
CL100K_JSON = TOKENIZERS / "cl100k_base" / "tokenizer.json"
R50K_TIKTOKEN = TOKENIZERS / "tiktoken" / "r50k_base.tiktoken"
CL100K_TIKTOKEN = TOKENIZERS / "tiktoken" / "cl100k_base.tiktoken"
MISTRAL_SP = TOKENIZERS / "mistral" / "tokenizer.model.v3"
TEKKEN = TOKENIZERS / "mistral" / "tekken_240718.json"
PYDOCS_JSONL = CORPORA / "python-docs" / "python-3.11-docs-rst.jsonl"
WIKITEXT_VALID = CORPORA / "wikitext-2" / "valid.txt"
SHAKESPEARE = CORPORA / "tinyshakespeare" / "input.txt"
WIKI_EN = CORPORA / "wikipedia-vital-summaries" / "summaries_en-us.json"
WIKI_FR = CORPORA / "wikipedia-vital-summaries" / "summaries_fr-fr.json"


def tiny_memmap(directory: Path) -> tuple[Path, Path]:
    """(memmap dir, tokenizer) in `directory`: 0.3 MB of stdlib source, a 512-token BPE, no ../shared."""
    from pretok_lib.demo.corpus import build_corpus, train_default_tokenizer
    from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

    corpus = build_corpus(directory / "c.parquet", max_mb=0.3)
    tok = train_default_tokenizer(corpus.path, directory / "tok", vocab_size=512)
    run_tokenize(TokenizeConfig(inputs=[corpus.path], out=str(directory / "memmap"), tokenizer=str(tok),
                                format="memmap", workers=0, progress=False))
    return directory / "memmap", Path(tok)


# Every test that mounts a file system (a tmpfs for a full disk, a read-only bind mount) carries this mark: as
# non-root it skips with this reason instead of failing in `mount` (tests/test_suite_rules.py checks each one does).
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a file system (tmpfs / bind mount): needs root")


def one_line(err: str, *needles: str, prefix: str = "pretok: error: ") -> str:
    """`err` (a command's stderr) is exactly one non-blank line, starting with `prefix`, no traceback, holding every
    needle: the CLI's one-line error contract. Returns that line."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# What an import or a library can make of the exception a stop signal's handler raises inside it: numpy's import
# fails with "ImportError: numpy._core.multiarray failed to import" (seen in `make test`), others wrap or swallow it
# and raise their own error.
SIGNAL_CONVERSIONS = [ImportError, RuntimeError, ValueError, OSError, PretokError]


def signals_turned_into(error: type, *signums: int) -> None:
    """Real signals to this process (default: one SIGTERM), one after the other; the exception a handler raises is
    caught by the code it interrupted and `error` raised instead."""
    import signal
    import time

    try:
        for signum in signums or (signal.SIGTERM,):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # each one handled before the next (a second one pending would merge with it)
        time.sleep(10)
    except BaseException:
        raise error("multiarray failed to import") from None
    raise AssertionError("no handler raised")


@pytest.fixture(scope="session", autouse=True)
def _temp_dir_of_this_session():
    """The suite's subprocesses put their temporary files (torchrun leaves a /tmp/torchelastic_* directory per
    launch, ~100 a run) in one directory per test process, removed at its end."""
    before, mine = os.environ.get("TMPDIR"), tempfile.mkdtemp(prefix="pretok-tests-")
    os.environ["TMPDIR"] = mine
    yield mine
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    shutil.rmtree(mine, ignore_errors=True)


def _signal_state() -> dict:
    """This process's signal mask and dispositions by signal number: what every process a test starts inherits
    (an ignored SIGINT or a blocked SIGTERM makes a child deaf to it)."""
    import signal

    # SIGCHLD: torch's DataLoader sets its handler once for the process's life (it chains to the previous one)
    exempt = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD)
    return {"mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            **{int(s): signal.getsignal(s) for s in signal.valid_signals() if s not in exempt}}


@pytest.fixture(autouse=True)
def _no_signal_state_leaks(request):
    """A test that leaves a signal ignored, handled or blocked in the test process fails (and the state is put
    back): a later test's subprocess would inherit it (a parent started with SIGINT ignored never stopped)."""
    import signal

    before = _signal_state()
    yield
    after = _signal_state()
    changed = [k for k in before if before[k] != after[k]]
    if not changed:
        return
    signal.pthread_sigmask(signal.SIG_SETMASK, before["mask"])
    for s in changed:
        if s != "mask" and before[s] is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(s, before[s])
    names = ["mask" if s == "mask" else signal.strsignal(s) or str(s) for s in changed]
    pytest.fail(f"{request.node.nodeid} left the signal state of the test process changed: {names}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: tests need ../shared/data beside the project (or PRETOK_SHARED_DATA)")
    return SHARED


# Test processes (`make test`: pytest-xdist `-n 3`): each test file is one unit of work, run whole on one process
# (its module fixtures are built once), and tests/slurm is one unit (one SLURM cluster). The slowest units start
# first, so the run does not end waiting on one long file (measured: `--durations`).
SLOW_FIRST = ("tests/notebooks/test_notebooks.py", "tests/slurm", "tests/bench/test_bench_train.py",
              "tests/train/test_resume.py", "tests/bench/test_gpu_check.py", "tests/engine/test_pretokenize.py",
              "tests/train/test_ddp.py", "tests/bench/test_bench_tokenize.py", "tests/engine/test_faults_tokenize.py",
              "tests/train/test_hardware.py", "tests/data/test_mixture.py", "tests/train/test_mixture_train.py",
              "tests/bench/test_gpu_study.py")


def work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/slurm" if path.startswith("tests/slurm/") else path


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the collection order below
    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {u: i for i, u in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable: file order kept otherwise


def _collect_then_freeze() -> None:
    import gc

    gc.unfreeze()
    gc.collect()
    gc.freeze()


# Python's full collections walk every object alive in the test process: the imports' millions (torch,
# transformers, pyarrow) and what earlier test files left, again and again (measured: 10 s of a 110 s run of three
# files, 3 s when each ran alone). After collection and after each test file, one full collection, then what is
# alive is frozen (out of later collections' reach); a file's own garbage is collected as usual.
def pytest_collection_finish(session) -> None:
    _collect_then_freeze()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    if nextitem is None or nextitem.path != item.path:
        _collect_then_freeze()
