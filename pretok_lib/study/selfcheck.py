"""The benchmarks' acceptance targets ("[FAIL] engine start-up ... (need <= 0.3)") check pretok itself on this
machine, not the researcher's data: inside a study they are kept out of the notebooks' printed output (they stay
in the benchmark JSON) and shown only folded, under `LABEL`."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

LABEL = "Tool self-check (not about your data): pretok's own benchmark targets on this machine"
TARGET_LINE = re.compile(r"^\s*\[(PASS|FAIL|info|INFO|n/a|N/A)\] ")


class _TargetFilter(io.TextIOBase):
    """A text stream passing whole lines on to `out`, except the target lines, which it keeps in `held`."""

    def __init__(self, out: TextIO):
        self.out, self.held, self._line = out, [], ""

    def write(self, s: str) -> int:
        self._line += s
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if TARGET_LINE.match(line):
                self.held.append(line.strip())
            else:
                self.out.write(line + "\n")
        return len(s)

    def flush(self) -> None:
        self.out.flush()

    def close_line(self) -> None:
        if self._line:
            self.write("\n")


@contextlib.contextmanager
def quiet_targets() -> Iterator[list[str]]:
    """Within it, target lines printed to `sys.stdout` are held back (the list it yields gets them); everything
    else is printed as it comes, line by line."""
    filt = _TargetFilter(sys.stdout)
    with contextlib.redirect_stdout(filt):
        try:
            yield filt.held
        finally:
            filt.close_line()
            filt.flush()


def self_check_rows(targets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A benchmark's targets as table rows that say what they are: the target, its value, what pretok needs, and
    `pretok check` (PASS/FAIL) instead of a bare "pass"."""
    return [{"pretok self-check": t.get("target"), "value": t.get("value"), "pretok needs": t.get("need"),
             "pretok check": {True: "PASS", False: "FAIL", None: "info"}.get(t.get("pass"), t.get("pass"))}
            for t in targets]
