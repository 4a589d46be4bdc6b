#!/usr/bin/env bash
# Installs what dstrain needs on a fresh Debian 12 machine. Idempotent: a second run with nothing
# to do finishes in seconds. Sources: Debian's packages and PyPI, nothing else.
#   scripts/setup.sh            to build and run dstrain: compilers and libraries, the torch
#                               virtualenv (LibTorch) with tensorboard (`dstrain tensorboard`)
#   scripts/setup.sh --sft      also transformers, for the fine-tuning demo (scripts/demo.sh --sft)
#   scripts/setup.sh --test     also what the test suite uses: Catch2, clang (fuzzers, format
#                               check), Open MPI, Slurm + munge, Chromium (the report's page),
#                               iproute2 (network namespaces), and the reference Python packages
#   DSTRAIN_VENV=/path ...      put the virtualenv elsewhere
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

tests=0; sft=0
for arg in "$@"; do
  case "$arg" in
    --test) tests=1 ;;
    --sft) sft=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$arg' (see scripts/setup.sh --help)" ;;
  esac
done

# --- Debian packages --------------------------------------------------------------------------
DEB_PACKAGES=(build-essential cmake ninja-build ccache pkg-config git python3 procps
              libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev libgloo-dev zlib1g-dev libonig-dev libutf8proc-dev)
DEB_TEST_PACKAGES=(catch2 clang clang-format libclang-rt-14-dev openmpi-bin slurm-wlm munge iproute2 chromium)
[ $tests -eq 1 ] && DEB_PACKAGES+=("${DEB_TEST_PACKAGES[@]}")
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
# One stamp per package set: the test packages are added to a virtualenv made for the demo.
venv_install() {  # venv_install STAMP PACKAGES...
  local stamp="$DSTRAIN_VENV/$1"; shift
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$*" ] && return 0
  mkdir -p "$(dirname "$DSTRAIN_VENV")"
  [ -x "$DSTRAIN_VENV/bin/python" ] || python3 -m venv "$DSTRAIN_VENV"
  "$DSTRAIN_VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
  echo "$*" > "$stamp"
}
if [ ! -f "$DSTRAIN_VENV/.dstrain-ready" ] || [ "$(cat "$DSTRAIN_VENV/.dstrain-ready")" != "torch==$DSTRAIN_TORCH_VERSION $DSTRAIN_PY_PACKAGES" ]; then
  say "creating the torch $DSTRAIN_TORCH_VERSION virtualenv in $DSTRAIN_VENV (a few GB, once per machine)"
fi
venv_install .dstrain-ready "torch==$DSTRAIN_TORCH_VERSION" $DSTRAIN_PY_PACKAGES
"$DSTRAIN_VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$DSTRAIN_TORCH_VERSION')"
if [ $tests -eq 1 ]; then
  [ -f "$DSTRAIN_VENV/.dstrain-test-ready" ] || say "adding the test suite's reference packages to $DSTRAIN_VENV"
  venv_install .dstrain-test-ready $DSTRAIN_PY_TEST_PACKAGES
  # TRL in an overlay over the torch venv (scripts/versions.sh says why); pip leaves what it sees
  # through the .pth file where it is ("outside environment") and installs only the rest.
  trl_stamp="$DSTRAIN_TRL_VENV/.dstrain-trl-ready"
  if [ ! -f "$trl_stamp" ] || [ "$(cat "$trl_stamp")" != "$DSTRAIN_PY_TRL_PACKAGES $DSTRAIN_PY_LMEVAL_PACKAGE" ]; then
    say "adding TRL (the DPO reference) and lm-evaluation-harness (the task reference) in $DSTRAIN_TRL_VENV"
    [ -x "$DSTRAIN_TRL_VENV/bin/python" ] || python3 -m venv "$DSTRAIN_TRL_VENV"
    site_of() { "$1/bin/python" -c 'import site; print(site.getsitepackages()[0])'; }
    site_of "$DSTRAIN_VENV" > "$(site_of "$DSTRAIN_TRL_VENV")/zz-dstrain-torch-venv.pth"
    "$DSTRAIN_TRL_VENV/bin/python" -m pip install -q --disable-pip-version-check $DSTRAIN_PY_TRL_PACKAGES
    "$DSTRAIN_TRL_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps $DSTRAIN_PY_LMEVAL_PACKAGE
    echo "$DSTRAIN_PY_TRL_PACKAGES $DSTRAIN_PY_LMEVAL_PACKAGE" > "$trl_stamp"
  fi
elif [ $sft -eq 1 ] && ! "$DSTRAIN_VENV/bin/python" -c 'import transformers' 2>/dev/null; then
  say "adding transformers to $DSTRAIN_VENV (the fine-tuning demo)"
  venv_install .dstrain-sft-ready $DSTRAIN_PY_SFT_PACKAGES
fi
say "setup done: torch $DSTRAIN_TORCH_VERSION in $DSTRAIN_VENV$([ $tests -eq 1 ] && echo ", with the test packages")$([ $tests -eq 0 ] && [ $sft -eq 1 ] && echo ", with transformers")"
