#!/usr/bin/env bash
# System packages the test suite and the report need: a single-node SLURM (tests of slurm/), headless Chromium
# (kaleido PNG export, report rendering test). Installs only what is missing; needs root (as on CI here).
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
command -v chromium >/dev/null || need+=(chromium fonts-liberation)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "install_system_deps: missing ${need[*]} and not root; install them or skip (tests needing them will say so)" >&2
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
