"""The `pretok` command's error boundary: one-line errors and their exit codes (docs/RUNS.md has the trainer's),
SIGTERM turned into an exception so cleanup runs, and stdout's encoding and vanished readers.

- `at_boundary(run, take_sigterm, script)`: run a command; a PretokError or OSError becomes one line and exit 1
  (or the error's `exit_code`), Ctrl-C 130, SIGTERM 143, a vanished stdout reader 141 (READER_GONE).
- `Terminated`: what SIGTERM raises where the command is (`_on_sigterm`; deferred past the import system).
- `reader_gone()`, `escape_unencodable_output()`: stdout at the end of a command and under a non-UTF-8 locale.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from .errors import PretokError, os_error


class Terminated(BaseException):
    """SIGTERM (e.g. `scancel`, a job's time limit) turned into an exception, so the run unwinds its cleanup."""


_sigterm_seen = False  # set by _on_sigterm: whatever the command fails with afterwards is the termination


IMPORT_MACHINERY = "<frozen importlib"   # the import system's own frames (module locks, finders, loaders)
DEFER_S = 0.02
READER_GONE = 141  # the exit code of a command whose output's reader went away, as the shell shows SIGPIPE's


def _on_sigterm(signum, frame) -> None:
    """Raise Terminated where the command is; but not inside the import system's own frames, where the exception
    escaped through C code that printed its traceback above the one line (seen once in `make test`: raised in
    importlib's `_lock_unlock_module`). There the signal is sent again DEFER_S later, to land past the import."""
    global _sigterm_seen
    if frame is not None and frame.f_code.co_filename.startswith(IMPORT_MACHINERY):
        timer = threading.Timer(DEFER_S, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        return
    _sigterm_seen = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def at_boundary(run: Callable[[], int | None], take_sigterm: bool = True, script: bool = False) -> int:
    """Run one command (`run`, returning its exit code or None) at the error boundary: a PretokError, and any
    OSError that reaches it (disk full, read-only file system, permissions, ...), is printed as one line
    `pretok: error: <file>: <problem>`, exit 1; Ctrl-C exits 130 and SIGTERM 143, each with one line (also when
    the exception the SIGTERM raised was turned into another error by an import or a library it interrupted).
    None of them leaves a manifest of a partial output.

    With `take_sigterm` (every subcommand but train, whose trainer checkpoints on it) SIGTERM is taken first
    thing, before parsing, so that the command's cleanup runs (temp files removed, child processes stopped);
    sweep and study take it over while they run their points and notebooks. Earlier, in interpreter start-up,
    the default action kills the process before it has written anything. When the work is over, the previous
    handler comes back, or with `script=True` (the `pretok` command) SIGTERM is ignored, so a late one cannot kill
    a finished command in interpreter shutdown (exit -15 over a complete output)."""
    global _sigterm_seen
    previous, _sigterm_seen = None, False
    if take_sigterm and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        try:
            rc = run()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, signal.SIG_IGN if script else previous)
    except BaseException as e:  # noqa: BLE001 - the boundary: mapped to its line and exit code, or re-raised
        return _exit_code(e)
    return rc or 0


def _exit_code(e: BaseException) -> int:
    """The error boundary's line and exit code for `e`; anything else is re-raised (a bug: its traceback)."""
    # The handler's Terminated can be caught and turned into another error on its way up: an import it interrupts
    # fails with ImportError (numpy: "multiarray failed to import"), a library may wrap it. After a SIGTERM, any
    # failure is that termination.
    if isinstance(e, Terminated) or (_sigterm_seen and isinstance(e, Exception)):
        print("pretok: terminated by SIGTERM (rerun the same command to resume)", file=sys.stderr)
        return 143
    if isinstance(e, PretokError):
        print(f"pretok: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)  # 3: a sweep/study stopped by a signal (pretok_lib.launch.procs.Stopped)
    if isinstance(e, BrokenPipeError) and reader_gone():
        return READER_GONE
    if isinstance(e, OSError):
        print(f"pretok: error: {os_error(e)}", file=sys.stderr)
        return 1
    if isinstance(e, KeyboardInterrupt):
        print("pretok: interrupted (rerun the same command to resume)", file=sys.stderr)
        return 130
    raise e


def reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (`pretok inspect OUT | head -1`; poll says POLLERR): then
    stdout is pointed at /dev/null, so that nothing more (nor the interpreter's last flush) fails on it, and the
    command ends quietly rather than with 'pretok: error: Broken pipe'."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # closed, detached, no poll: not a pipe's reader
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return gone


def escape_unencodable_output() -> None:
    """Print what stdout's encoding cannot show as escapes (stderr does so already): under a non-UTF-8 locale
    (LANG=en_US on ISO-8859-1, PYTHONUTF8=0 with LC_ALL=C, PYTHONIOENCODING=ascii) a summary holding '\u2026' or a
    non-ASCII path failed a finished command with a UnicodeEncodeError traceback and exit 1."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # a closed or detached stdout: nothing will be printed there anyway
            pass
