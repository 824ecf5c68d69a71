#!/usr/bin/env bash
# Submit a slurm/*.sbatch script with the cluster's options from slurm/cluster.env (or PRETOK_* env vars);
# prints the job id.
#
#   slurm/submit.sh [--dry-run] [SBATCH_OPTION...] SCRIPT [SCRIPT_ARG...]
#
# --dry-run (or PRETOK_DRY_RUN=1): submit nothing (no sbatch needed); print the full sbatch command line, then as
# comments the script's own #SBATCH options, the job's environment and the launch prefix of its steps (common.sh).
#
# #SBATCH lines cannot read an env file, so account, partition, time, ... are passed as sbatch options here;
# options given before SCRIPT come last and win (e.g. --array=3, --dependency=afterok:123, --time=02:00:00).
# Plain `sbatch [your flags] slurm/X.sbatch ...` from the checkout works too (scripts source cluster.env).
set -euo pipefail
PRETOK_ROOT=${PRETOK_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PRETOK_ROOT
# shellcheck source=cluster.env
source "$PRETOK_ROOT/slurm/cluster.env"

dry=${PRETOK_DRY_RUN:-}
user=()
while [ $# -gt 0 ] && [[ $1 == -* ]]; do
    if [ "$1" = --dry-run ]; then dry=1; else user+=("$1"); fi
    shift
done
if [ $# -eq 0 ]; then
    echo "usage: slurm/submit.sh [--dry-run] [SBATCH_OPTION...] SCRIPT [SCRIPT_ARG...]" >&2
    exit 2
fi
script=$1; shift
[ -f "$script" ] || { echo "submit.sh: error: $script: no such script (give sbatch options as --name=value)" >&2; exit 2; }
[ "$dry" = 1 ] || command -v sbatch >/dev/null || { echo "submit.sh: error: sbatch not found on PATH (not on a SLURM login node?)" >&2; exit 2; }
case $PRETOK_GPU_REQUEST in
    gpus-per-node|gres) ;;
    *) echo "submit.sh: error: PRETOK_GPU_REQUEST=$PRETOK_GPU_REQUEST: choose gpus-per-node or gres" >&2; exit 2 ;;
esac

opts=(--parsable)
[ -n "$PRETOK_ACCOUNT" ] && opts+=(--account="$PRETOK_ACCOUNT")
[ -n "$PRETOK_PARTITION" ] && opts+=(--partition="$PRETOK_PARTITION")
[ -n "$PRETOK_QOS" ] && opts+=(--qos="$PRETOK_QOS")
[ -n "$PRETOK_TIME" ] && opts+=(--time="$PRETOK_TIME")
[ -n "$PRETOK_MEM" ] && opts+=(--mem="$PRETOK_MEM")
[ -n "$PRETOK_CONSTRAINT" ] && opts+=(--constraint="$PRETOK_CONSTRAINT")
[ -n "$PRETOK_CPUS_PER_TASK" ] && opts+=(--cpus-per-task="$PRETOK_CPUS_PER_TASK")
case $(basename "$script") in
    train*.sbatch)  # processes per node = --ntasks-per-node (train.sbatch starts one torchrun per node with that many)
        procs=${PRETOK_PROCS_PER_NODE:-}
        if [ -z "$procs" ]; then
            if [ "${PRETOK_GPUS_PER_NODE:-0}" -gt 0 ]; then procs=$PRETOK_GPUS_PER_NODE; else procs=1; fi
        fi
        opts+=(--nodes="$PRETOK_NODES" --ntasks-per-node="$procs")
        if [ "${PRETOK_GPUS_PER_NODE:-0}" -gt 0 ]; then
            if [ "$PRETOK_GPU_REQUEST" = gres ]; then opts+=(--gres=gpu:"$PRETOK_GPUS_PER_NODE")
            else opts+=(--gpus-per-node="$PRETOK_GPUS_PER_NODE"); fi
        fi
        ;;
esac
# shellcheck disable=SC2206  # PRETOK_SBATCH_EXTRA is deliberately word-split
[ -n "$PRETOK_SBATCH_EXTRA" ] && opts+=($PRETOK_SBATCH_EXTRA)

if [ "$dry" = 1 ]; then
    # The line as a shell would run it (quoted), then what the job's steps get (slurm/common.sh).
    line=(sbatch "${opts[@]}" ${user[@]+"${user[@]}"} "$(cd "$(dirname "$script")" && pwd)/$(basename "$script")" "$@")
    printf '%q ' "${line[@]}" | sed 's/ $//'
    echo
    echo "#   script's own options: $(sed -n 's/^#SBATCH[[:space:]]*//p' "$script" | tr '\n' ' ' | sed 's/ $//')"
    echo "#   job environment: PRETOK_ROOT=$PRETOK_ROOT${PRETOK_SETUP:+ PRETOK_SETUP=\"$PRETOK_SETUP\"}"
    py=$PRETOK_PYTHON  # as slurm/common.sh picks it (before PRETOK_SETUP runs)
    if [ -z "$py" ]; then
        if [ -n "$PRETOK_CONTAINER" ] || ! [ -x "$PRETOK_ROOT/.venv/bin/python" ]; then py=python3; else py=$PRETOK_ROOT/.venv/bin/python; fi
    fi
    echo "#   every job step: srun <step flags>${PRETOK_SRUN_EXTRA:+ $PRETOK_SRUN_EXTRA}${PRETOK_CONTAINER:+ $PRETOK_CONTAINER} $py ..."
    exit 0
fi
out=$(sbatch "${opts[@]}" ${user[@]+"${user[@]}"} "$script" "$@")
echo "${out%%;*}"
