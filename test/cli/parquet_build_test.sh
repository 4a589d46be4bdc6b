#!/usr/bin/env bash
# The build never fails because of pyarrow (issue 56): the Parquet plugin's rules
# (cmake/DstrainParquet.cmake) configured against a pyarrow folder whose headers need C++20 build
# the plugin as C++20; after the wheel's libraries are renamed (what `pip install -U pyarrow`
# does: libparquet.so.2100 -> .2600) the next build reconfigures and links the new ones; with
# pyarrow gone, it reconfigures and builds without the plugin. Never "missing and no known rule".
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
real=$("$DSTRAIN_VENV/bin/python" -c 'import os, pyarrow; print(os.path.dirname(pyarrow.__file__))' 2>/dev/null) || true
[ -n "$real" ] && [ -f "$real/include/arrow/api.h" ] || { echo "SKIP: no pyarrow wheel with headers in $DSTRAIN_VENV"; exit 77; }
arrow=$(cd "$real" && ls libarrow.so.[0-9]* | grep -E '^libarrow\.so\.[0-9]+$')
parquet=$(cd "$real" && ls libparquet.so.[0-9]* | grep -E '^libparquet\.so\.[0-9]+$')

# A wheel like pyarrow 26's: the same libraries, headers that refuse anything before C++20.
mkdir -p fake && cp -r "$real/include" fake/include
for f in "$real"/*.so.*; do ln -s "$f" "fake/$(basename "$f")"; done
{ printf '#if __cplusplus < 202002L\n#error "Arrow needs C++20 (as arrow/buffer.h with std::span does)"\n#endif\n'; cat "$real/include/arrow/api.h"; } > fake/include/arrow/api.h
echo "// a newer wheel" >> fake/include/arrow/util/config.h

build() {  # configure once, then build as a developer does: `cmake --build` re-runs what it must
  expect_status 0 cmake --build b
  STATE=$(cat b/plugin-state.txt)
}
expect_status 0 cmake -S "$SRC/test/cmake/parquet_plugin" -B b -G Ninja -DDSTRAIN_SOURCE="$SRC" -DDSTRAIN_PYARROW_DIR="$WORK/fake"
expect_out "dstrain: Parquet input through $WORK/fake/$arrow (C++20)"
build
[ "$STATE" = ON ] && [ -f b/libdstrain_parquet.so ] || fail "the plugin was not built: $OUT"
grep -q -- "-std=[gnuc]*++20" b/build.ninja || fail "the plugin was not compiled as C++20"
nm -D --defined-only b/libdstrain_parquet.so | grep -q dstrain_parquet_open || fail "the plugin lacks its entry points"
ok "headers that need C++20: the plugin is built as C++20 (dstrain itself stays C++17)"

# pip install -U pyarrow: the versioned file names change under a configured build.
sleep 1  # a new mtime for the folder
for lib in "$arrow" "$parquet"; do mv "fake/$lib" "fake/${lib%.*}.9900"; done
build
expect_out "Re-running CMake"
grep -q "libparquet.so.9900" b/build.ninja && ! grep -q "$parquet" b/build.ninja || fail "the build still links the old library names"
[ "$STATE" = ON ] && [ -f b/libdstrain_parquet.so ] || fail "the plugin was lost: $OUT"
ok "libraries renamed after configuring (a pyarrow upgrade): the next build reconfigures and links the new ones"

sleep 1
rm -rf fake
build
expect_out "no usable pyarrow wheel at $WORK/fake"
[ "$STATE" = OFF ] || fail "the plugin is still configured without pyarrow"
ok "pyarrow removed after configuring: the next build reconfigures and builds without the plugin"

mkdir -p real-b
expect_status 0 cmake -S "$SRC/test/cmake/parquet_plugin" -B real-b -G Ninja -DDSTRAIN_SOURCE="$SRC" -DDSTRAIN_PYARROW_DIR="$real"
grep -q "(C++17)\|(C++20)" <<<"$OUT" || fail "the installed wheel was not probed: $OUT"
ok "the installed wheel: $(grep -o 'Parquet input through .*' <<<"$OUT")"
finish
