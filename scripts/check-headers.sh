#!/usr/bin/env bash
# Fails when a header under lib/ (or cuda/) includes something heavy: <torch/torch.h>, c10d,
# CLI11, yaml-cpp or nlohmann. Headers may see at most ATen/core/Tensor.h; the heavy includes
# stay in the few .cpp files that need them (build time on 2 cores is a feature).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pattern='#[[:space:]]*include[[:space:]]*[<"](torch/torch\.h|torch/csrc/distributed/c10d/|torch/csrc/api/|CLI/|yaml-cpp/|nlohmann/|ATen/ATen\.h)'
if hits=$(grep -rnE "$pattern" --include='*.h' --include='*.hpp' --include='*.cuh' lib cuda); then
  echo "check-headers: heavy includes in headers (move them into the .cpp that needs them):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check-headers: OK ($(find lib cuda -name '*.h' | wc -l) headers)"
