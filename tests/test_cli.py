"""The command line's front door: `pretok --help` says what the tool is for, `pretok --version` names it."""

from __future__ import annotations

import subprocess
import sys

import pretok_lib
from pretok_lib.cli import build_parser


def test_help_opens_with_the_purpose_and_every_subcommand() -> None:
    text = build_parser().format_help()
    assert text.split("\n\n")[1].startswith("pretok: pretokenize LLM training corpora once")
    for name in ("tokenize", "merge", "inspect", "verify", "train", "sweep", "study", "bench", "gpu-check"):
        assert name in text


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"pretok {pretok_lib.__version__}"
