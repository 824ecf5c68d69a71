#!/usr/bin/env bash
# GPU acceptance of a bare machine (no network): DDP over NCCL through torchrun (one process per GPU), bf16
# autocast, pinned memory, torch.compile, fp32 on TF32, a SIGKILL + resume, the smoke study; prints a JSON verdict
# and exits 0 when no check failed. See docs/GPU_CHECK.md. Extra arguments go to `pretok gpu-check`
# (e.g. --gpus 2 --skip study).
#   scripts/gpu_check.sh                       # everything, verdict in runs/gpu-check/verdict.json
#   scripts/gpu_check.sh --device cpu          # the same checks a CPU can run (gloo, fp32), CUDA ones skipped
exec "$(dirname "$0")/pretok_offline.sh" gpu-check "$@"
