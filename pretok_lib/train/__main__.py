"""`python -m pretok_lib.train` / `torchrun ... -m pretok_lib.train`: see pretok_lib/train/run.py."""

import signal
import sys

from . import collector

collector.import_training_modules()  # torch and transformers, without collection passes over them

from .run import main  # noqa: E402

code = main()
# The run has ended and its status is written: a stop signal arriving during interpreter shutdown changes nothing
# (without this, a SIGTERM just after completion made the exit status "killed by SIGTERM").
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
sys.exit(code)
