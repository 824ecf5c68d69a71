"""`python -m pretok_lib.train` / `torchrun ... -m pretok_lib.train`: see pretok_lib/train/run.py."""

import sys

from .run import main

sys.exit(main())
