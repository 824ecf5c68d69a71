#!/usr/bin/env bash
# System packages the test suite and the report need: a single-node SLURM (tests of slurm/), headless Chromium
# (kaleido PNG export, report rendering test). Installs only what is missing, with apt-get as root (as on CI here).
# Without root or apt-get it says what is missing and exits 0: tests needing a package say so, the study writes
# its figures as HTML only (and says how to get PNGs).
#   bash scripts/install_system_deps.sh [slurm] [chromium]     default: both (`make test`); `make demo`: chromium
set -euo pipefail
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(slurm chromium)
need=()
for group in "${groups[@]}"; do
    case "$group" in
        slurm)
            command -v slurmctld >/dev/null || need+=(slurmctld)
            command -v slurmd >/dev/null || need+=(slurmd)
            command -v sbatch >/dev/null || need+=(slurm-client)
            command -v munged >/dev/null || need+=(munge) ;;
        chromium)  # any of the names pretok_lib/analysis/report.py looks for
            command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
                command -v google-chrome >/dev/null || command -v google-chrome-stable >/dev/null ||
                command -v chrome >/dev/null || [ -x "${BROWSER_PATH:-}" ] || need+=(chromium fonts-liberation) ;;
        *) echo "install_system_deps: unknown group '$group' (slurm, chromium)" >&2; exit 2 ;;
    esac
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$EUID" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install_system_deps: missing ${need[*]}; not installed (needs root and apt-get): install them yourself" >&2
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
