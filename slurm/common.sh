# Sourced by every slurm/*.sbatch at job start: cluster settings, software set-up, which python runs pretok, and
# the one launch prefix every job step goes through. Needs PRETOK_ROOT (the checkout; slurm/submit.sh exports it,
# plain sbatch falls back to the submit dir).
set -euo pipefail
# shellcheck source=cluster.env
source "$PRETOK_ROOT/slurm/cluster.env"
if [ -n "$PRETOK_SETUP" ]; then
    set +u  # module/venv scripts often read unset variables
    eval "$PRETOK_SETUP"
    set -u
fi
if [ -z "$PRETOK_PYTHON" ]; then
    if [ -n "$PRETOK_CONTAINER" ]; then PRETOK_PYTHON=python3  # the container's, not a host venv's
    elif [ -x "$PRETOK_ROOT/.venv/bin/python" ]; then PRETOK_PYTHON=$PRETOK_ROOT/.venv/bin/python
    else PRETOK_PYTHON=python3; fi
fi
export PRETOK_ROOT PRETOK_PYTHON
export PYTHONPATH="$PRETOK_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Word-split once, deliberately (cluster.env documents both as word lists).
read -r -a PRETOK_SRUN_FLAGS <<< "$PRETOK_SRUN_EXTRA"
read -r -a PRETOK_CONTAINER_CMD <<< "$PRETOK_CONTAINER"

# launch_prefix [SRUN_OPTION...]: sets the array LAUNCH to the prefix of one job step, the only way a job runs
# anything of pretok: `srun SRUN_OPTION... $PRETOK_SRUN_EXTRA $PRETOK_CONTAINER` (inside a job), or
# `$PRETOK_CONTAINER` alone outside one (a script run by hand with bash). Used as "${LAUNCH[@]}" CMD (also with &,
# so that $! is srun itself and signals reach it).
launch_prefix() {
    LAUNCH=()
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        LAUNCH=(srun "$@" ${PRETOK_SRUN_FLAGS[@]+"${PRETOK_SRUN_FLAGS[@]}"})
    fi
    LAUNCH+=(${PRETOK_CONTAINER_CMD[@]+"${PRETOK_CONTAINER_CMD[@]}"})
}

# step CMD...: CMD as one single-task job step on the job's CPUs (tokenize, verify, merge, papermill, nbconvert).
step() {
    launch_prefix --nodes=1 --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}"
    ${LAUNCH[@]+"${LAUNCH[@]}"} "$@"
}

py() { step "$PRETOK_PYTHON" "$@"; }
pretok() { py -m pretok_lib.cli "$@"; }

# A job's own log line: time, job (and array task) id, node.
log() { echo "[$(date -u +%H:%M:%S)] ${SLURM_JOB_ID:-local}${SLURM_ARRAY_TASK_ID:+[$SLURM_ARRAY_TASK_ID]} $(hostname -s): $*" >&2; }
