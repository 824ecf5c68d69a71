"""The zygote's early fastokens build: started from a tokenizer.json's bytes before the file is identified, adopted
only when identify then finds that very file an hf-json tokenizer run by fastokens."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from pretok_lib import tokenizer
from pretok_lib.engine import zygote
from pretok_lib.tokenizer import identify, make_encoder
from tests.conftest import GPT2_JSON, MISTRAL_SP, R50K_TIKTOKEN, TEKKEN

TEXTS = ["def f(x):\n    return x ** 2  # squares", "Héllo wörld <|endoftext|> ok"]


@pytest.fixture()
def fresh(monkeypatch):
    """The zygote's module state as in a new zygote process."""
    monkeypatch.setattr(zygote, "_ENCODERS", {})
    monkeypatch.setattr(zygote, "_INFO", [])
    monkeypatch.setattr(zygote, "_FAILED", {})


def prepare(spec: str, backend: str | None, early: list | None = None) -> list:
    """Run the zygote's start-up sequence in this process: the early build in a thread, identify beside it (or,
    given `early`, that result as the early build's). Returns the early build's result list."""
    if early is None:
        build, early = zygote._start_early_build(spec, backend)
    else:
        build = threading.Thread(target=lambda: None)
        build.start()
    zygote._prepare(spec, backend, build, early)
    assert not build.is_alive()  # joined: the zygote forks with no other thread
    return early


def same_ids(enc, reference) -> None:
    for got, want in zip(enc.encode_batch(TEXTS), reference.encode_batch(TEXTS)):
        np.testing.assert_array_equal(got, want)


def test_early_build_only_for_hf_tokenizer_json(shared_data: Path, tmp_path: Path) -> None:
    fingerprint, tok = zygote._early_fastokens(str(GPT2_JSON), None)
    assert fingerprint == identify(str(GPT2_JSON)).fingerprint and tok.vocab_size == 50257
    shutil.copy(GPT2_JSON, tmp_path / "tokenizer.json")
    assert zygote._early_fastokens(str(tmp_path), "fastokens")[0] == fingerprint  # a directory holding a tokenizer.json
    shutil.copy(TEKKEN, tmp_path / "vocab.json")  # tekken under another name: recognised by its content
    for spec in (TEKKEN, tmp_path / "vocab.json", MISTRAL_SP, tmp_path / "missing.json"):
        assert zygote._early_fastokens(str(spec), None) is None, spec
    (tmp_path / "bad.json").write_text('{"model": ')
    fingerprint, failure = zygote._early_fastokens(str(tmp_path / "bad.json"), None)  # the failure, for _prepare
    assert fingerprint.startswith("sha256:") and isinstance(failure, ValueError)
    assert zygote._early_fastokens(str(GPT2_JSON), "hf-tokenizers") is None  # another backend forced


def test_prepare_adopts_the_early_build(fresh, shared_data: Path, monkeypatch) -> None:
    built = []
    monkeypatch.setattr(tokenizer, "make_encoder", lambda info, b: built.append(b) or make_encoder(info, b))
    prepare(str(GPT2_JSON), None)
    assert zygote._INFO[0].kind == "hf-json" and set(zygote._ENCODERS) == {"fastokens"}
    assert built == []  # no second build: the early one is used
    enc = zygote._ENCODERS["fastokens"]
    assert enc.backend == "fastokens" and enc.decode(enc.encode_batch(TEXTS)[0]) == "".join(TEXTS)
    same_ids(enc, make_encoder(zygote._INFO[0], "hf-tokenizers"))


def test_prepare_builds_anew_when_the_early_build_is_not_that_file(fresh, shared_data: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """A file changed between the early read and identify (other fingerprint): the early build is dropped and the
    backend built from the identified file; another backend asked for: no early build at all."""
    other = tmp_path / "tokenizer.json"
    shutil.copy(GPT2_JSON, other)
    stale = zygote._early_fastokens(str(other), None)
    other.write_text(other.read_text().replace('"<|endoftext|>"', '"<|end|>"'))
    built = []
    monkeypatch.setattr(tokenizer, "make_encoder", lambda info, b: built.append(b) or make_encoder(info, b))
    prepare(str(other), None, [stale])
    assert zygote._INFO[0].fingerprint != stale[0] and set(zygote._ENCODERS) == {"fastokens"}
    assert built == ["fastokens"]  # built again, from the identified file
    zygote._ENCODERS.clear()
    zygote._INFO.clear()
    assert prepare(str(GPT2_JSON), "hf-tokenizers") == [None]  # no early build
    assert set(zygote._ENCODERS) == {"hf-tokenizers"} and built == ["fastokens", "hf-tokenizers"]


def test_prepare_falls_back_when_fastokens_cannot_be_built(fresh, tmp_path: Path, monkeypatch) -> None:
    """A tokenizer.json fastokens refuses (a Whitespace pre-tokenizer): the early build's failure is adopted (no
    second try), the next candidate built, the reason reported in `Ready`; asking for fastokens again (a worker, the
    main process's check) raises that same failure without a rebuild."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    built = []
    monkeypatch.setattr(tokenizer, "make_encoder", lambda info, b: built.append(b) or make_encoder(info, b))
    build, early = zygote._start_early_build(str(tmp_path), None)
    ready = zygote._prepare(str(tmp_path), None, build, early)
    assert isinstance(early[0][1], ValueError) and built == ["hf-tokenizers"]
    assert ready.backend == "hf-tokenizers" and ready.error is None
    assert set(ready.failures) == {"fastokens"} and "Whitespace" in ready.failures["fastokens"]
    with pytest.raises(tokenizer.BackendUnavailable, match="Whitespace"):
        zygote._encoder("fastokens")
    assert built == ["hf-tokenizers"]


def test_prepare_reports_a_forced_backend_that_cannot_be_built(fresh, tmp_path: Path, shared_data: Path) -> None:
    gapped = tmp_path / "r50k_base.tiktoken"
    lines = R50K_TIKTOKEN.read_bytes().splitlines(keepends=True)
    gapped.write_bytes(b"".join(lines[:30000] + lines[30001:]))
    ready = prepare_ready(str(gapped), "fastokens")
    assert (ready.backend, list(ready.failures)) == (None, ["fastokens"]) and zygote._ENCODERS == {}
    zygote._FAILED.clear()
    zygote._INFO.clear()
    ready = prepare_ready(str(gapped), None)
    assert ready.backend == "tiktoken" and "non-contiguous" in ready.failures["fastokens"]
    assert ready.fingerprint == identify(str(gapped)).fingerprint
    assert prepare_ready(str(tmp_path / "missing.tiktoken"), None).error  # the main process reports it


def prepare_ready(spec: str, backend: str | None) -> "zygote.Ready":
    build, early = zygote._start_early_build(spec, backend)
    return zygote._prepare(spec, backend, build, early)


@pytest.mark.parametrize("spec", ["gpt2", "tekken", "sentencepiece", "gpt2+s3"])
def test_the_zygote_holds_one_thread_when_it_forks(shared_data: Path, tmp_path: Path, spec: str) -> None:
    """In its own environment (`WORKER_ENV`), after all it does before forking (imports, the early build and its
    warm-up, identify, building the backend, the filesystems of remote inputs), the zygote has one thread, native
    ones counted (/proc/self/task): a fork copies no other thread. Arrow allocates from malloc there."""
    import json
    import os
    import subprocess
    import sys

    path = {"gpt2": GPT2_JSON, "tekken": TEKKEN, "sentencepiece": MISTRAL_SP, "gpt2+s3": GPT2_JSON}[spec]
    preload = ("s3",) if spec.endswith("+s3") else ()
    code = f"""
import json, os, threading
import pyarrow as pa
from pretok_lib.engine import zygote
build, early = zygote._start_early_build({str(path)!r}, None)
from pretok_lib import sources
from pretok_lib.engine import parts
from pretok_lib.sources.remote import preload_filesystems
preload_filesystems({preload!r})
ready = zygote._prepare({str(path)!r}, None, build, early)
import time
for _ in range(100):  # a joined thread's kernel task can outlive its join() by a moment; a pool's stays
    if len(os.listdir("/proc/self/task")) == 1:
        break
    time.sleep(0.01)
print(json.dumps([ready.backend, threading.active_count(), len(os.listdir("/proc/self/task")),
                  pa.default_memory_pool().backend_name]))
"""
    env = {**os.environ, **zygote.WORKER_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path)
    backend, py_threads, os_threads, pool = json.loads(out.stdout)
    assert backend is not None and py_threads == 1 and os_threads == 1, (backend, py_threads, os_threads)
    assert pool == "system"


MAIN_SCRIPT = """import os, sys
with open({marks!r}, "a") as f:
    f.write(f"{{os.getpid()}} {{__name__}}\\n")
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
def go():
    run_tokenize(TokenizeConfig(inputs=[{data!r}], out=sys.argv[1], tokenizer={tok!r}, format="memmap",
                                seq_len=64, workers=2, progress=False))
{call}
"""


def test_a_users_main_script_of_any_form_starts_the_workers_and_runs_once(tmp_path):
    """The zygote is spawned; spawn runs the parent's main script again in the child unless told otherwise. The
    engine hides it: a script calling the engine at top level without a `__main__` guard, one fed on stdin, one
    given by -c, and a guarded one all tokenize with 2 workers to the same bytes, and each script's top level
    runs once (never again in the zygote as `__mp_main__`, paying its imports there)."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [f"document {i}: " + "words and more words " * (i % 9 + 1)
                                      for i in range(400)]}), data)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    outs = {}
    for form in ("unguarded", "guarded", "stdin", "-c"):
        marks = tmp_path / f"{form}.marks"
        call = 'if __name__ == "__main__":\n    go()' if form == "guarded" else "go()"
        script = MAIN_SCRIPT.format(marks=str(marks), data=str(data), tok=str(GPT2_JSON), call=call)
        out = tmp_path / f"out-{form}"
        if form == "stdin":
            cmd, stdin = [sys.executable, "-", str(out)], script
        elif form == "-c":
            cmd, stdin = [sys.executable, "-c", script, str(out)], None
        else:
            (tmp_path / f"{form}.py").write_text(script)
            cmd, stdin = [sys.executable, str(tmp_path / f"{form}.py"), str(out)], None
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert p.returncode == 0, (form, p.stderr[-2000:])
        assert [line.split()[1] for line in marks.read_text().splitlines()] == ["__main__"], form
        outs[form] = (out / "data.bin").read_bytes()
    assert len(set(outs.values())) == 1 and len(outs["guarded"]) > 0


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3, None])
def test_the_main_process_closing_mid_check_ends_the_zygote_quietly(capfd, delay: float | None) -> None:
    """A completed run closes the backend check's connection with a request still in flight (and a stopped run may
    exit first): whether the zygote is reading the request, encoding it or sending the answer, or has answered, it
    stops answering, lets its workers finish and exits 0 without a traceback on the user's stderr."""
    import time

    from pretok_lib.engine.workers import Workers

    info = identify(str(GPT2_JSON))
    texts = [TEXTS[0] * 2000] * 40  # a few MB: encoding and answering take a moment
    with Workers(str(GPT2_JSON), None, 1) as w:
        w.expect(1)  # the plan's tasks: the zygote forks (and answers) once it knows them
        backend = w.backend(info, None)
        capfd.readouterr()
        w.conn.send((texts, backend))
        if delay is None:
            assert not isinstance(w.conn.recv(), BaseException)
        else:
            time.sleep(delay)
        w.drained = True  # as after a completed run: close() sends the workers None and closes the connection
        zyg = w.zygote
    assert zyg.exitcode == 0
    assert capfd.readouterr().err == ""


def test_an_answer_that_cannot_be_sent_is_an_error_for_the_main_process(monkeypatch) -> None:
    """An encode result that cannot be pickled reaches the main process as an error; the zygote answers on."""
    import multiprocessing as mp

    class Unpicklable:
        def encode_batch(self, texts):
            return lambda: texts

    monkeypatch.setattr(zygote, "_encoder", lambda backend: Unpicklable())
    main, child = mp.Pipe()
    main.send((TEXTS, "any"))
    assert zygote._answer(child) is True
    got = main.recv()
    assert isinstance(got, RuntimeError) and "could not be sent" in str(got)
    main.close()
    assert zygote._answer(child) is False  # the main process closed its end: the checks end


def _tokenize_in_a_pool_worker(corpus: str, out: str, workers: int) -> tuple[str, object]:
    import contextlib
    import io

    from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

    err = io.StringIO()  # the worker's own stderr: a forkserver started by an earlier test is not this test's capfd
    try:
        with contextlib.redirect_stderr(err):
            m = run_tokenize(TokenizeConfig(inputs=[corpus], out=out, tokenizer=str(GPT2_JSON), workers=workers,
                                            progress=False, part_mb=0.01))
        return "ok", m["run"]["workers"], "daemonic process" in err.getvalue()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e), None


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_run_tokenize_in_a_daemonic_pool_worker_writes_the_same_bytes(shared_data: Path, tmp_path: Path, capfd,
                                                                       method: str) -> None:
    """A multiprocessing Pool (or DataLoader) worker is daemonic and may not start processes: run_tokenize with
    workers > 0 there failed with "AssertionError: daemonic processes are not allowed to have children". It now
    tokenizes inline, says so in one line, and writes the bytes of any other worker count."""
    import json
    import multiprocessing as mp

    from tests.conftest import PYDOCS_JSONL

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": json.loads(line)["text"][:3000]}) + "\n"
                              for line in list(PYDOCS_JSONL.open())[:30]))
    with mp.get_context(method).Pool(1) as pool:
        got = pool.starmap(_tokenize_in_a_pool_worker, [(str(corpus), str(tmp_path / f"w{w}"), w) for w in (0, 2)])
    assert got == [("ok", 0, False), ("ok", 0, True)]          # workers 2: said so in one line
    for name in ("data.bin", "data.idx"):
        assert (tmp_path / "w0" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


@pytest.mark.parametrize("tasks", [1, 3, 50])
def test_the_zygote_forks_no_more_workers_than_the_plan_has_tasks(shared_data: Path, tmp_path: Path,
                                                                  tasks: int) -> None:
    """Told the plan's task count before it forks (the main process plans while the zygote builds the encoder), the
    zygote forks min(workers, tasks) workers, says how many, and they all end with the pool; a small input on a node
    of many cores does not fork one idle worker per core."""
    import time

    import psutil

    from pretok_lib.engine.workers import Workers
    from pretok_lib.tokenizer import load_tokenizer

    with Workers(str(GPT2_JSON), None, 6) as w:
        w.expect(tasks)
        w.backend(load_tokenizer(str(GPT2_JSON)), None)
        while w.started is None:
            assert w.zygote.is_alive()
            time.sleep(0.01)
        assert w.started == min(6, tasks)
        end = time.monotonic() + 60  # only catches a hang: forking takes milliseconds
        while len(psutil.Process(w.zygote.pid).children()) < w.started:
            assert time.monotonic() < end
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(psutil.Process(w.zygote.pid).children()) == w.started
        zygote_pid = w.zygote.pid
    assert not psutil.pid_exists(zygote_pid) or psutil.Process(zygote_pid).status() == psutil.STATUS_ZOMBIE
    assert Workers(str(GPT2_JSON), None, 0).started == 0


def test_the_zygote_forks_only_once_told_the_plans_tasks_however_late():
    """`pretok tokenize` starts the zygote before its own imports, which on a slow disk can outlast the build: the
    zygote, its encoder ready, waits for the plan's task count instead of forking one worker per core."""
    import time

    from pretok_lib.engine.workers import Workers
    from pretok_lib.tokenizer import load_tokenizer

    with Workers(str(GPT2_JSON), None, 6) as w:
        w.backend(load_tokenizer(str(GPT2_JSON)), None)  # the build is done: the zygote could fork now
        time.sleep(0.3)
        assert w.started is None and w.zygote.is_alive()
        w.expect(2)
        end = time.monotonic() + 60  # only catches a hang
        while w.started is None:
            assert time.monotonic() < end
            time.sleep(0.01)
        assert w.started == 2


@pytest.mark.parametrize("workers", [1, 3, 16])
def test_a_worker_holds_a_task_ahead_only_while_every_other_worker_could_still_take_one(monkeypatch, workers):
    """A worker takes its next task ahead (to read its unit's first row group while it encodes) only when at least
    as many tasks are queued as there are workers: a small plan, or the run's tail, is not left to a few of them."""
    import multiprocessing as mp
    import time

    monkeypatch.setattr(zygote, "_FORKED", [workers])
    for queued in (0, workers - 1, workers, workers + 1):
        q = mp.get_context("fork").Queue()
        try:
            for k in range(queued):
                q.put(("unit", k))
            deadline = time.monotonic() + 10      # the feeder thread has written them all to the pipe
            while queued and not q._reader.poll() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)
            got = zygote._take_now(q)
            assert (got is zygote._NOTHING) if queued < workers else (got == ("unit", 0)), (queued, got)
        finally:
            q.close()
            q.join_thread()


@pytest.mark.parametrize("workers", [1, 2, 4, 16, 288])
def test_workers_progress_messages_stay_few_however_many_workers(monkeypatch, workers):
    """Each worker sends its first batch's progress at once (the run's start-up ends there), then at most every
    0.25 s, and less often with many workers: all of them together send at most 16 progress messages a second on
    their own (288 workers at 4 a second each would cost the main process a wake-up every 0.9 ms). What is not
    sent goes with the part's record, so no count is lost."""
    clock, sent = [1000.0], []

    class Results:
        def put(self, msg):
            sent.append(msg)

    monkeypatch.setattr(zygote.time, "time", lambda: clock[0])
    report = zygote._Progress(Results(), workers)
    for _ in range(4000):  # a batch every 10 ms for 40 s
        report(100, 1, 10)
        clock[0] += 0.01
    rate = (len(sent) - 1) / 40
    assert sent[0][1:4] == (100, 1, 10)  # the first batch, at once
    assert rate <= 4.05 and rate * workers <= 16.5  # each at most every 0.25 s; all together 16 a second
    rest = report.take()
    assert sum(m[1] for m in sent) + rest[0] == 4000 * 100 and sum(m[3] for m in sent) + rest[2] == 4000 * 10
