#!/usr/bin/env bash
# Pretokenize on a cluster: a job array (one task per shard), then a merge + verify job that runs only if every
# task succeeded (--dependency=afterok). Prints "ARRAY_JOB_ID MERGE_JOB_ID".
#
#   slurm/pretokenize.sh [--dry-run] [--tasks LIST] [--shards-dir DIR] NUM_SHARDS OUT INPUT... --tokenizer T [options]
#
# Shards go to DIR (default OUT.shards), the merged dataset to OUT. Rerun the same command to finish a run:
# complete shards are skipped. --tasks 3,5 resubmits only those array tasks (then the merge again). Settings
# (account, partition, time, cpus per task = tokenizer workers, ...) come from slurm/cluster.env / PRETOK_*.
# --dry-run: submit nothing; print the two sbatch lines as a script (array=$(sbatch ...); merge=$(sbatch
# --dependency=afterok:$array ...)) with slurm/submit.sh's comments on the jobs' environment and launch prefix.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tasks="" root="" dry=${PRETOK_DRY_RUN:-}
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1; shift ;;
        --tasks) tasks=$2; shift 2 ;;
        --tasks=*) tasks=${1#*=}; shift ;;
        --shards-dir) root=$2; shift 2 ;;
        --shards-dir=*) root=${1#*=}; shift ;;
        *) break ;;
    esac
done
if [ $# -lt 3 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: slurm/pretokenize.sh [--dry-run] [--tasks LIST] [--shards-dir DIR] NUM_SHARDS OUT INPUT... --tokenizer T [options]" >&2
    exit 2
fi
num=$1 out=$2; shift 2
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
out=$(abs "$out")
root=$(abs "${root:-$out.shards}")
if [ "$dry" = 1 ]; then
    "$here/submit.sh" --dry-run --array="${tasks:-0-$((num - 1))}" "$here/pretokenize_array.sbatch" "$num" "$root" "$@" \
        | sed '1s/^/array=$(/; 1s/$/)/'
    "$here/submit.sh" --dry-run --dependency=afterok:ARRAY_JOB_ID "$here/merge.sbatch" "$num" "$root" "$out" \
        | sed '1s/^/merge=$(/; 1s/$/)/; 1s/afterok:ARRAY_JOB_ID/afterok:$array/'
    exit 0
fi
array=$("$here/submit.sh" --array="${tasks:-0-$((num - 1))}" "$here/pretokenize_array.sbatch" "$num" "$root" "$@")
merge=$("$here/submit.sh" --dependency=afterok:"$array" "$here/merge.sbatch" "$num" "$root" "$out")
echo "submitted tokenize array $array (shards in $root) and merge $merge (into $out)" >&2
echo "$array $merge"
