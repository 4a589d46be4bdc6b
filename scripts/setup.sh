#!/usr/bin/env bash
# Installs everything dstrain needs on a fresh Debian 12 machine. Idempotent: a second run with
# nothing to do finishes in seconds. Sources: Debian's packages and PyPI, nothing else.
#   scripts/setup.sh            system packages (if missing) + the torch virtualenv
#   DSTRAIN_VENV=/path ...      put the virtualenv elsewhere
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# --- Debian packages --------------------------------------------------------------------------
DEB_PACKAGES=(build-essential cmake ninja-build ccache pkg-config git
              libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev catch2 libgloo-dev zlib1g-dev libonig-dev libutf8proc-dev
              clang clang-format libclang-rt-14-dev openmpi-bin slurm-wlm munge python3 iproute2 procps chromium)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The python3 on PATH (Debian's, or e.g. pyenv's) must be able to make a virtualenv.
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- The torch virtualenv ---------------------------------------------------------------------
stamp="$DSTRAIN_VENV/.dstrain-ready"
want="torch==$DSTRAIN_TORCH_VERSION $DSTRAIN_PY_TEST_PACKAGES"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "creating the torch $DSTRAIN_TORCH_VERSION virtualenv in $DSTRAIN_VENV (a few GB, once per machine)"
  mkdir -p "$(dirname "$DSTRAIN_VENV")"
  [ -x "$DSTRAIN_VENV/bin/python" ] || python3 -m venv "$DSTRAIN_VENV"
  "$DSTRAIN_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "torch==$DSTRAIN_TORCH_VERSION" $DSTRAIN_PY_TEST_PACKAGES
  "$DSTRAIN_VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$DSTRAIN_TORCH_VERSION')"
  echo "$want" > "$stamp"
fi
say "setup done: torch $DSTRAIN_TORCH_VERSION in $DSTRAIN_VENV"
