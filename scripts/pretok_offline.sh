#!/usr/bin/env bash
# `pretok SUBCOMMAND ARGS...` on a machine without network, from this checkout: the hubs off, the project on the
# path, the checkout's .venv python if there is one (else python3; PRETOK_PYTHON overrides). Used by gpu_check.sh
# and gpu_study.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PRETOK_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m pretok_lib.cli "$@"
