"""A stand-in for `python -m pretok_lib.train` in sweep tests: honours the CLI and run-directory contract
(docs/RUNS.md: run.json status, metrics.jsonl, exit code) in milliseconds. Rank 0 writes; every rank appends
its rank to `invocations.txt`; with $FAKE_SAVE_CONFIG it records config.yaml. Run ids listed in $FAKE_FAIL_IDS fail; $FAKE_SLEEP_S delays the run; SIGTERM or
SIGINT during the delay ends it like the trainer: run.json `interrupted`, exit 3."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    assert argv[0] == "--config" and Path(argv[1]).is_file(), argv
    over = dict(a.split("=", 1) for a in argv[2:])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    rdir = Path(over["run.dir"]) / over["run.id"]
    rdir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("FAKE_SAVE_CONFIG") and rank == 0:  # the resolved config, as the trainer records it
        from pretok_lib.train.config import load_config, save_config

        save_config(load_config(argv[1], argv[2:]), rdir / "config.yaml")
    with open(rdir / "invocations.txt", "a") as fh:
        fh.write(f"{rank}/{world}\n")
    fail = over["run.id"] in os.environ.get("FAKE_FAIL_IDS", "").split(",")
    stop = []
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda signum, frame: stop.append(signum))
    with open(rdir / f"pid.{rank}", "w") as fh:
        fh.write(f"{os.getpid()}\n")
    end = time.monotonic() + float(os.environ.get("FAKE_SLEEP_S", "0"))
    while time.monotonic() < end and not stop:
        time.sleep(0.02)
    if rank == 0:
        status = "interrupted" if stop else "failed" if fail else "completed"
        (rdir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "wall_s": 0.0, "loss": 1.0}) + "\n")
        (rdir / "run.json").write_text(json.dumps({"run_id": over["run.id"], "version": 1, "status": status,
                                                   "error": "fake failure" if fail else None, "world_size": world,
                                                   "overrides": over,
                                                   "torch_threads": os.environ.get("PRETOK_THREADS_PER_RANK")}))
    print(f"fake train rank {rank}/{world}: {'stopped' if stop else 'failing' if fail else 'ok'}", flush=True)
    return 3 if stop else 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
