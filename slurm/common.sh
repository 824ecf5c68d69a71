# Sourced by every slurm/*.sbatch at job start: cluster settings, software set-up, which python runs pretok.
# Needs PRETOK_ROOT (the checkout; slurm/submit.sh exports it, plain sbatch falls back to the submit dir).
set -euo pipefail
# shellcheck source=cluster.env
source "$PRETOK_ROOT/slurm/cluster.env"
if [ -n "$PRETOK_SETUP" ]; then
    set +u  # module/venv scripts often read unset variables
    eval "$PRETOK_SETUP"
    set -u
fi
if [ -z "$PRETOK_PYTHON" ]; then
    if [ -x "$PRETOK_ROOT/.venv/bin/python" ]; then PRETOK_PYTHON=$PRETOK_ROOT/.venv/bin/python; else PRETOK_PYTHON=python3; fi
fi
export PRETOK_ROOT PRETOK_PYTHON
export PYTHONPATH="$PRETOK_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

pretok() { "$PRETOK_PYTHON" -m pretok_lib.cli "$@"; }

# A job's own log line: time, job (and array task) id, node.
log() { echo "[$(date -u +%H:%M:%S)] ${SLURM_JOB_ID:-local}${SLURM_ARRAY_TASK_ID:+[$SLURM_ARRAY_TASK_ID]} $(hostname -s): $*" >&2; }
