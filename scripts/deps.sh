#!/usr/bin/env bash
# Installs the Debian packages llm4d's build and tests need, once: packages already present are left
# alone. Without root it installs nothing and says loudly what is missing; the tests that need a
# missing package then report themselves as skipped.
set -euo pipefail
# slurm-wlm and munge: the two-node Slurm tests; iproute2: the simulated nodes (network namespaces)
# and, inside the QEMU guest, `ip` and `rdma`; python3-matplotlib: scripts/plot.py (training curves,
# the planner's memory bars); libibverbs-dev: the verbs headers (net_verbs.c; the library is opened
# at run time); ibverbs-providers: the soft-RoCE provider (librxe) for the guest; qemu-system-x86 and
# busybox-static: the guest that runs the RDMA tests (test/verbs_vm.sh); zlib1g-dev (crc32) and
# libjansson-dev (JSON parsing): checkpoints, GPT-2's encoder.json, JSON Lines; libpcre2-dev: GPT-2's
# pre-tokenizer (Unicode letters and numbers); python3-pip: the tokenizer references below
PACKAGES=(gcc make libgomp1 zlib1g-dev libjansson-dev libpcre2-dev python3 python3-numpy python3-torch python3-matplotlib python3-pip
          iproute2 slurm-wlm munge libibverbs-dev ibverbs-providers qemu-system-x86 busybox-static)
# The guest's kernel: Debian's linux-image-6.1 package, downloaded (not installed) into this cache;
# test/verbs_vm.sh takes vmlinuz and the modules it needs out of the .deb.
CACHE=${LLM4D_CACHE:-/var/cache/llm4d}
root=0
[ "$(id -u)" -eq 0 ] && root=1
updated=0
apt_update() { [ $updated -eq 1 ] || apt-get update -qq; updated=1; }

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all packages present (${PACKAGES[*]})"
elif [ $root -eq 0 ]; then
    echo "deps: WARNING: not root, cannot install: ${missing[*]}" >&2
    echo "deps: WARNING: tests that need them will be SKIPPED; run 'sudo bash scripts/deps.sh' to install" >&2
else
    echo "deps: installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt_update
    # other apt users on the machine (unattended upgrades, a parallel build) hold the lock for a while
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
    echo "deps: installed ${missing[*]}"
fi

# safetensors (PyPI; Debian has no package): the Hugging Face checkpoint tests write and read files with
# it (t_hf_*); without it they fall back to a numpy writer in the test and skip the reading side.
if /usr/bin/python3 -c 'import safetensors' 2>/dev/null; then
    echo "deps: python safetensors present"
elif [ $root -eq 0 ]; then
    echo "deps: WARNING: not root, cannot pip install safetensors: the Hugging Face tests will check against numpy only" >&2
elif /usr/bin/python3 -m pip install -q --break-system-packages safetensors; then
    echo "deps: installed python safetensors from PyPI"
else
    echo "deps: WARNING: pip install safetensors FAILED: the Hugging Face tests will check against numpy only" >&2
fi
# The tokenizer tests' references, from PyPI for Debian's /usr/bin/python3 (no Debian package has them):
# tiktoken and Hugging Face tokenizers. Debian's Python is externally managed (PEP 668), hence
# --break-system-packages; pip leaves Debian's own packages alone and puts these in /usr/local.
PY_REFS=(tiktoken tokenizers)
py_missing=()
for m in "${PY_REFS[@]}"; do /usr/bin/python3 -c "import $m" >/dev/null 2>&1 || py_missing+=("$m"); done
if [ ${#py_missing[@]} -eq 0 ]; then
    echo "deps: python modules present (${PY_REFS[*]})"
elif [ $root -eq 0 ]; then
    echo "deps: WARNING: not root, cannot pip install ${py_missing[*]}: the tokenizer tests compare against what is there, or are SKIPPED" >&2
elif ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
    echo "deps: WARNING: pip for /usr/bin/python3 is missing (python3-pip): cannot install ${py_missing[*]}" >&2
elif /usr/bin/python3 -m pip install -q --break-system-packages "${py_missing[@]}"; then
    echo "deps: installed ${py_missing[*]} from PyPI for /usr/bin/python3"
else
    echo "deps: WARNING: pip could not install ${py_missing[*]} (no network to PyPI?): the tokenizer tests compare against what is there, or are SKIPPED" >&2
fi

# Hugging Face transformers, the reference Llama of t_hf_transformers: for Debian's /usr/bin/python3 and its
# PyTorch 1.13. transformers 4.49.0 is the newest release that runs on torch 1.13 (4.50 imports
# torch.distributed.tensor, which torch 1.13 lacks); it pins tokenizers <0.22 and huggingface_hub <1.0, older
# than the tokenizers the tokenizer tests use above. So it goes with those two pins into its own directory,
# $CACHE/py-transformers-4.49.0, which the test puts first on PYTHONPATH: /usr/bin/python3 and its packages
# are left as they are (--no-deps: Debian's numpy, torch, safetensors, regex, requests, yaml, tqdm serve it).
TF_VERSION=4.49.0
TF_DIR="$CACHE/py-transformers-$TF_VERSION"
tf_ok() { PYTHONPATH="$TF_DIR" /usr/bin/python3 -c 'import transformers, sys; from transformers import LlamaForCausalLM; sys.exit(transformers.__version__ != sys.argv[1])' "$TF_VERSION" >/dev/null 2>&1; }
if tf_ok; then
    echo "deps: python transformers $TF_VERSION present in $TF_DIR"
elif ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
    echo "deps: WARNING: cannot write $CACHE: transformers is not installed and t_hf_transformers will be SKIPPED (run as root, or set LLM4D_CACHE)" >&2
elif ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
    echo "deps: WARNING: pip for /usr/bin/python3 is missing (python3-pip): cannot install transformers; t_hf_transformers will be SKIPPED" >&2
else
    rm -rf "$TF_DIR.tmp"
    # into a temporary directory, then one rename: an interrupted install never looks complete
    if /usr/bin/python3 -m pip install -q --no-deps --target "$TF_DIR.tmp" "transformers==$TF_VERSION" tokenizers==0.21.0 huggingface_hub==0.27.1 &&
        rm -rf "$TF_DIR" && mv "$TF_DIR.tmp" "$TF_DIR" && tf_ok; then
        echo "deps: installed transformers $TF_VERSION (with tokenizers 0.21.0, huggingface_hub 0.27.1) from PyPI into $TF_DIR"
    else
        rm -rf "$TF_DIR.tmp"
        echo "deps: WARNING: could not install transformers $TF_VERSION into $TF_DIR (no network to PyPI?): t_hf_transformers will be SKIPPED" >&2
    fi
fi

if compgen -G "$CACHE/kernel/linux-image-6.1.*.deb" >/dev/null; then
    echo "deps: guest kernel cached ($(basename "$(ls "$CACHE"/kernel/linux-image-6.1.*.deb | sort -V | tail -n 1)"))"
elif ! mkdir -p "$CACHE/kernel" 2>/dev/null || [ ! -w "$CACHE/kernel" ]; then
    echo "deps: WARNING: cannot write $CACHE/kernel: the RDMA tests in a QEMU guest will be SKIPPED (run as root, or set LLM4D_CACHE)" >&2
else
    newest() { apt-cache pkgnames linux-image-6.1.0- 2>/dev/null | grep -E '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V | tail -n 1; }
    pkg=$(newest)
    if [ -z "$pkg" ] && [ $root -eq 1 ]; then apt_update; pkg=$(newest); fi
    if [ -z "$pkg" ]; then
        echo "deps: WARNING: apt knows no linux-image-6.1.0-N-amd64 package: the RDMA tests in a QEMU guest will be SKIPPED" >&2
    else
        tmp=$(mktemp -d "$CACHE/kernel/download.XXXXXX")
        # root downloads as itself (apt's _apt sandbox user cannot write the cache); then one rename,
        # so an interrupted download never leaves a partial .deb under the name the tests look for
        if (cd "$tmp" && apt-get -q -o APT::Sandbox::User="$(id -un)" download "$pkg" >/dev/null) && mv "$tmp"/*.deb "$CACHE/kernel/"; then
            echo "deps: guest kernel $pkg downloaded into $CACHE/kernel"
        else
            echo "deps: WARNING: could not download $pkg: the RDMA tests in a QEMU guest will be SKIPPED" >&2
        fi
        rm -rf "$tmp"
    fi
fi
