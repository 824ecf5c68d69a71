#!/usr/bin/env bash
# GPU acceptance of a bare machine (no network): DDP over NCCL through torchrun (one process per GPU), bf16
# autocast, pinned memory, torch.compile, fp32 on TF32, a SIGKILL + resume, the smoke study; prints a JSON verdict
# and exits 0 when no check failed. See docs/GPU_CHECK.md. Extra arguments go to `pretok gpu-check`
# (e.g. --gpus 2 --skip study).
#   scripts/gpu_check.sh                       # everything, verdict in runs/gpu-check/verdict.json
#   scripts/gpu_check.sh --device cpu          # the same checks a CPU can run (gloo, fp32), CUDA ones skipped
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PRETOK_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m pretok_lib.cli gpu-check "$@"
