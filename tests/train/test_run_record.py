"""run.json has one reader: a record, or None with the reason, whatever state a crash left the file in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretok_lib.train.run_record import read_run_record, run_error, run_status


@pytest.mark.parametrize("content, why", [(None, "missing"), ("", "unreadable"), ('{"status": "compl', "unreadable"),
                                          ("[1, 2]", "not a JSON object"), ('"completed"', "not a JSON object"),
                                          (b"\xff\xfe", "unreadable")])
def test_damaged_records_read_as_none(tmp_path: Path, content, why: str) -> None:
    if content is not None:
        (tmp_path / "run.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    problems: list[str] = []
    assert read_run_record(tmp_path, problems) is None and run_status(tmp_path) is None
    assert len(problems) == 1 and problems[0].startswith(f"run.json: {why}")


def test_record(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed", "error": "disk full"}))
    assert run_status(tmp_path) == "failed" and run_error(tmp_path) == "disk full"
    assert read_run_record(tmp_path)["status"] == "failed"
