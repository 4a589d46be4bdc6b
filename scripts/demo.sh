#!/usr/bin/env bash
# Sets up, builds and runs the demo: a small DeepSeek-style model trained by 2 worker processes
# on CPU (Gloo), on the text bundled in recipes/data/. Extra arguments go to `dstrain train`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/setup.sh"
"$DSTRAIN_ROOT/scripts/build.sh"
cd "$DSTRAIN_ROOT"
# A fresh run directory each time: dstrain never trains into an existing run.
exec "$DSTRAIN_BUILD_DIR/dstrain" train recipes/demo.yaml --set run_dir="runs/demo-$(date +%Y%m%d-%H%M%S)" "$@"
