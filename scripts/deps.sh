#!/usr/bin/env bash
# Installs the Debian packages llm4d's build and tests need, once: packages already present are left
# alone. Without root it installs nothing and says loudly what is missing; the tests that need a
# missing package then report themselves as skipped.
set -euo pipefail
# slurm-wlm and munge: the two-node Slurm tests; iproute2: the simulated nodes (network namespaces);
# python3-matplotlib: scripts/plot.py (training curves, the planner's memory bars)
PACKAGES=(gcc make libgomp1 python3 python3-numpy python3-torch python3-matplotlib iproute2 slurm-wlm munge)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all packages present (${PACKAGES[*]})"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: WARNING: not root, cannot install: ${missing[*]}" >&2
    echo "deps: WARNING: tests that need them will be SKIPPED; run 'sudo bash scripts/deps.sh' to install" >&2
    exit 0
fi
echo "deps: installing ${missing[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: installed ${missing[*]}"
