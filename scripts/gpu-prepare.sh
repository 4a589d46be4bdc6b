#!/usr/bin/env bash
# Before a GPU call (issue 12), on this machine: the lent GPU machine has CUDA, nvcc, CMake,
# ninja and PyTorch 2.11 (its LibTorch), but no package manager and no Debian -dev packages.
# This fetches the Debian packages the build needs besides LibTorch (yaml-cpp, CLI11,
# nlohmann-json, fmt, Catch2, Oniguruma, utf8proc, and gloo's headers, which the torch wheel lacks), unpacks them into
# .gpu-deps/root (ignored by git; name it in the device call's `carry`), and drops their docs.
# Their CMake files use relative prefixes, so scripts/gpu-check.sh points CMAKE_PREFIX_PATH there.
#   scripts/gpu-prepare.sh        then: device run "bash scripts/gpu-check.sh" with carry [.gpu-deps]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
dest="$DSTRAIN_ROOT/.gpu-deps"
packages=(libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev nlohmann-json3-dev libfmt-dev libfmt9 catch2 libgloo-dev libonig-dev libonig5 libutf8proc-dev libutf8proc2)
rm -rf "$dest"
mkdir -p "$dest/debs" "$dest/root"
chmod 777 "$dest/debs"  # apt's sandbox user writes the downloads
(cd "$dest/debs" && apt-get download -q "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
for p in "${packages[@]}"; do
  ls "$dest/debs/${p}"_*.deb >/dev/null 2>&1 || die "apt-get download $p failed (is the package index current? run apt-get update)"
done
for deb in "$dest"/debs/*.deb; do dpkg-deb -x "$deb" "$dest/root"; done
rm -rf "$dest/debs" "$dest/root/usr/share/doc" "$dest/root/usr/share/man" "$dest/root/usr/share/lintian"
# The versions, for the record that travels with the call.
for p in "${packages[@]}"; do dpkg-query -W -f='${Package} ${Version}\n' "$p" 2>/dev/null || echo "$p (not installed here)"; done > "$dest/VERSIONS"
say "GPU build dependencies in $dest: $(du -sh "$dest" | cut -f1) ($(find "$dest/root" -type f | wc -l) files); carry .gpu-deps in the device call"
