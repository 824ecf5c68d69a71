"""The command line's front door: `pretok --help` says what the tool is for, `pretok --version` names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pretok_lib
from pretok_lib.cli import build_parser
from pretok_lib.errors import PretokError

from .conftest import SIGNAL_CONVERSIONS, signals_turned_into


def test_help_opens_with_the_purpose_and_every_subcommand() -> None:
    text = build_parser().format_help()
    assert text.split("\n\n")[1].startswith("pretok: pretokenize LLM training corpora once")
    for name in ("tokenize", "merge", "inspect", "verify", "train", "sweep", "study", "bench", "gpu-check", "report"):
        assert name in text


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"pretok {pretok_lib.__version__}"


def test_tokenize_counts_its_wall_time_from_the_process_start(tmp_path, shared_data) -> None:
    """`pretok tokenize` records its wall time and start-up from the process start (interpreter and imports
    included: "process start to the first batch tokenized"); main() called in-process counts from the call."""
    import json
    import os
    import time

    from pretok_lib.cli import main

    from .conftest import GPT2_JSON, PYDOCS_JSONL, ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    code = ("import time; time.sleep(0.5); from pretok_lib.cli import process_start_time; "
            "print(time.time() - process_start_time())")
    t = time.time()
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env=env).stdout)
    took = time.time() - t      # the child lived within this: its age is bounded here, not by a machine's speed
    assert 0.5 <= age <= took + 0.05
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(list(PYDOCS_JSONL.open())[:20]))
    args = ["tokenize", str(corpus), "--tokenizer", str(GPT2_JSON), "--workers", "1", "--no-progress"]
    t = time.time()  # the command sleeps 1 s before it runs: its start-up must count that second
    r = subprocess.run([sys.executable, "-c", "import sys, time; time.sleep(1.0); sys.argv[0] = 'pretok'; "
                        "from pretok_lib.cli import script; script()", *args, "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=300)
    took = time.time() - t
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "o" / "manifest.json").read_text())["run"]
    assert run["startup_seconds"] >= 1.0 and run["wall_seconds"] <= took
    t = time.time()
    assert main([*args, "--out", str(tmp_path / "p"), "--workers", "0"]) == 0
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["run"]["wall_seconds"] <= time.time() - t


@pytest.mark.parametrize("turned_into", SIGNAL_CONVERSIONS)
def test_a_signals_turned_into_another_error_still_ends_as_terminated(monkeypatch, capsys, turned_into) -> None:
    from pretok_lib import cli

    def merge_interrupted_in_an_import(args):
        signals_turned_into(turned_into)

    monkeypatch.setattr(cli, "cmd_merge", merge_interrupted_in_an_import)
    assert cli.main(["merge", "shard-0", "--out", "out"]) == 143
    assert capsys.readouterr().err == "pretok: terminated by SIGTERM (rerun the same command to resume)\n"

    # the next command in this process, failing the same way without a SIGTERM, is not taken for one
    def merge_failing(args):
        raise turned_into("out: bad")

    monkeypatch.setattr(cli, "cmd_merge", merge_failing)
    if turned_into in (OSError, PretokError):
        assert cli.main(["merge", "shard-0", "--out", "out"]) == 1
        assert capsys.readouterr().err.startswith("pretok: error: ")
    else:
        with pytest.raises(turned_into):
            cli.main(["merge", "shard-0", "--out", "out"])


# Minimal arguments that parse, per subcommand; a subcommand missing here fails the test below (add it).
PARSES = {"corpus": ["--out", "c.parquet"], "tokenize": ["in.txt", "--out", "o", "--tokenizer", "t"],
          "merge": ["s0", "--out", "o"], "inspect": ["d"], "verify": ["d"], "demo": [], "export": ["runs/x"],
          "sweep": ["--config", "c.yaml"], "study": [], "gpu-check": [], "gpu-study": [], "bench tokenize": [],
          "bench loaders": [], "bench train": [], "report": ["runs"]}
OWN_SIGTERM = {"train"}  # the trainer checkpoints on SIGTERM (tests/train)


def _subcommands() -> list[str]:
    def subs(parser) -> dict:
        act = next((a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"), None)
        return act.choices if act else {}

    out = []
    for name, p in subs(build_parser()).items():
        inner = subs(p)
        out += [f"{name} {n}" for n in inner] if inner else [name]
    return out


@pytest.mark.parametrize("command", _subcommands())
def test_sigterm_ends_every_subcommand_with_one_line_and_its_cleanup(monkeypatch, capsys, command: str) -> None:
    """SIGTERM (scancel, a time limit, `kill`) in the middle of any subcommand raises in its code, so its cleanup
    runs (a temp file removed, a child process stopped) and it ends with one line and exit 143, not killed by the
    default action with a temp file or an orphaned child left behind (corpus, bench, export, gpu-check, ...)."""
    from pretok_lib import cli

    if command in OWN_SIGTERM:
        return
    assert command in PARSES, f"add `{command}` to PARSES"
    cleaned = []

    def work(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(command)
        raise AssertionError("SIGTERM did not stop the command")

    def not_taken(signum, frame):  # stands for the default action (which would end pytest)
        raise RuntimeError("SIGTERM left to the default action")

    parsed = build_parser(command.split()[0]).parse_args([*command.split(), *PARSES[command]])
    monkeypatch.setattr(cli, parsed.fn.__name__, work)
    previous = signal.signal(signal.SIGTERM, not_taken)
    try:
        assert cli.main([*command.split(), *PARSES[command]]) == 143
        assert signal.getsignal(signal.SIGTERM) is not_taken   # the previous handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == [command]
    assert capsys.readouterr().err == "pretok: terminated by SIGTERM (rerun the same command to resume)\n"


def test_sigterm_during_corpus_removes_its_temp_file(tmp_path: Path) -> None:
    """`pretok corpus` stopped by SIGTERM while writing: exit 143, one line, no temp file and no output."""
    out = tmp_path / "c.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", "corpus", "--out", str(out), "--max-mb", "400"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".c.parquet.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["pretok: terminated by SIGTERM (rerun the same command to resume)"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_non_utf8_stdout_prints_escapes_not_a_traceback(tmp_path, shared_data, encoding) -> None:
    """Under a locale whose encoding cannot show the summary ('\u2026' after the fingerprint) or a non-ASCII path,
    a finished command printed a UnicodeEncodeError traceback and exited 1 over a complete output."""
    import os

    from .conftest import GPT2_JSON, ROOT

    data = tmp_path / "donn\u00e9es \u65e5"
    data.mkdir()
    (data / "d.jsonl").write_text('{"text": "caf\u00e9 \u65e5\u672c"}\n' * 3, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": encoding,
           "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    out = data / "out"
    for args in (["tokenize", str(data / "d.jsonl"), "--out", str(out), "--tokenizer", str(GPT2_JSON),
                  "--workers", "0", "--no-progress"], ["inspect", str(out)]):
        r = subprocess.run([sys.executable, "-m", "pretok_lib.cli", *args], capture_output=True, timeout=300, env=env)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")[-2000:]
        assert b"\\u2026" in r.stdout and b"documents   3" in r.stdout


@pytest.mark.parametrize("lines", [1, 3, 3000])
def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path, lines) -> None:
    """`pretok inspect OUT | head -1`: the reader of stdout is gone before the command writes; it printed
    'pretok: error: Broken pipe' (exit 1). Output of any size: what print() wrote, what the last flush wrote."""
    args = ["sweep", "--config", "configs/tiny.yaml", "--axis", f"run.seed={','.join(map(str, range(lines)))}",
            "--dry-run", "--runs-dir", "{tmp}"]
    from .conftest import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", *[a.format(tmp=tmp_path) for a in args]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                                     # before the child has imported anything
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (141, "")


def test_a_sigterm_inside_the_import_system_is_sent_again_past_it(monkeypatch) -> None:
    """Seen once in `make test`: a SIGTERM raised Terminated inside importlib's `_lock_unlock_module`, and C code
    printed its traceback above the one line. In the import system's own frames the handler now raises nothing and
    sends the signal again a moment later; anywhere else it raises at once."""
    import os
    import threading
    import types

    from pretok_lib import exits as c

    sent = threading.Event()
    monkeypatch.setattr(c.os, "kill", lambda pid, sig: sent.set() if (pid, sig) == (os.getpid(), signal.SIGTERM)
                        else None)
    monkeypatch.setattr(c, "_sigterm_seen", False)     # an earlier in-process command may have left it set
    before = signal.getsignal(signal.SIGTERM)
    try:
        importlib_frame = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))
        assert c._on_sigterm(signal.SIGTERM, importlib_frame) is None
        assert sent.wait(timeout=60) and not c._sigterm_seen
        with pytest.raises(c.Terminated):
            c._on_sigterm(signal.SIGTERM, sys._getframe())
        assert c._sigterm_seen
    finally:
        signal.signal(signal.SIGTERM, before)


HEAVY = ("torch", "transformers", "datasets", "pandas")


def test_the_light_subcommands_never_import_the_training_stack(tmp_path, shared_data) -> None:
    """Building the parser of any light subcommand, and running `pretok tokenize` end to end, imports none of torch,
    transformers, datasets or pandas (torch alone is ~1.5 s of start-up: a subcommand's arguments defined next to
    code that imports it once cost `pretok tokenize` 2 s of its 3)."""
    import json
    import os

    from .conftest import GPT2_JSON, PYDOCS_JSONL, ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    code = ("import sys; from pretok_lib.cli import SUBCOMMANDS_LIGHT, build_parser\n"
            "for c in SUBCOMMANDS_LIGHT:\n    build_parser(c)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(list(PYDOCS_JSONL.open())[:20]))
    code = ("import atexit, sys; sys.argv[0] = 'pretok'\n"
            f"atexit.register(lambda: print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr))\n"
            "from pretok_lib.cli import script; script()")
    r = subprocess.run([sys.executable, "-c", code, "tokenize", str(corpus), "--tokenizer", str(GPT2_JSON),
                        "--workers", "1", "--no-progress", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "[]", r.stderr[-2000:]
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["counts"]["documents"] > 0
