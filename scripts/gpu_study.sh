#!/usr/bin/env bash
# Issue 39's measurements on a GPU machine in one command and one JSON (docs/GPU_CHECK.md, "The study on a GPU"):
# the study's model (MFU, bf16 + torch.compile), the five data paths' measured vs predicted stall, and the engine's
# scaling over worker counts. Extra arguments go to `pretok gpu-study` (its --help lists them), e.g.
#   scripts/gpu_study.sh --corpus corpus.jsonl --tokenizer tekken.json --engine-tokenizer gpt2/tokenizer.json \
#       --budget 540 --json out/gpu-study.json
exec "$(dirname "$0")/pretok_offline.sh" gpu-study "$@"
