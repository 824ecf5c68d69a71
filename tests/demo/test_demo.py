"""`pretok demo`: the embedded corpus and tokenizer into every format, each verified; a failed verification is the
command's failure, not a line among its printouts."""

from __future__ import annotations

from pathlib import Path

import pytest

import pretok_lib.demo.run as demo
from pretok_lib.cli import main
from pretok_lib.pretokenize import FORMATS


@pytest.mark.parametrize("bad", [None, *FORMATS])
def test_a_format_that_fails_verify_fails_the_demo(bad, tmp_path: Path, monkeypatch, capsys) -> None:
    """The demo printed `verify FAILED` and exited 0."""
    real = demo.verify

    def verify(dest, sample=16):
        rep = real(dest, sample=sample)
        if Path(dest).name == bad:
            rep.problems.append("part-000000: checksum mismatch")
        return rep

    monkeypatch.setattr(demo, "verify", verify)
    rc = main(["demo", "--out", str(tmp_path / "d"), "--max-mb", "0.2", "--vocab-size", "300", "--workers", "0"])
    out, err = capsys.readouterr()
    assert out.count("verify      OK") == len(FORMATS) - (bad is not None)
    errors = [line for line in err.splitlines() if "error" in line]   # (progress lines go to stderr too)
    if bad is None:
        assert rc == 0 and errors == []
    else:
        assert rc == 1 and len(errors) == 1 and f"verify failed for 1 of 3 formats: {bad}: part-000000" in errors[0]
