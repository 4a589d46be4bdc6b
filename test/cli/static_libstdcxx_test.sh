#!/usr/bin/env bash
# The H200 machine's compiler links libstdc++ statically; there, every std::filesystem call of
# dstrain's bound to the copy the torch wheel's libtorch.so exports, and its remove_all jumped to
# address 0: every GPU run that pruned a checkpoint or cleaned a log folder died of SIGSEGV at
# its end (issue 17). This relinks dstrain's own objects here the same way (libstdc++.a instead
# of -lstdc++), then checks the imports (scripts/check-link.sh) and runs what crashed there.
#   static_libstdcxx_test.sh DSTRAIN SRC   (DSTRAIN in a Ninja build directory)
source "$(dirname "$0")/../lib.sh"
build="$(dirname "$DSTRAIN")"
archive="$(g++ -print-file-name=libstdc++.a)"
[ -f "$archive" ] || { echo "SKIPPED: no libstdc++.a for this compiler ($archive)"; exit 77; }
[ -f "$build/build.ninja" ] || { echo "SKIPPED: $build is not a Ninja build directory"; exit 77; }
link="$(cd "$build" && ninja -t commands dstrain | tail -1)"
grep -qE -- "-o dstrain( |$)" <<<"$link" || fail "no link command for dstrain in $build: $link"
relinked="$WORK/dstrain-static-libstdcxx"
static_link="$(sed -E "s#-Wl,--push-state,--no-as-needed,-lstdc\+\+,--pop-state##; s# -lstdc\+\+( |$)# $archive\1#g; s#-o dstrain( |$)#-static-libstdc++ -o $relinked\1#" <<<"$link")"
(cd "$build" && eval "$static_link") > link.log 2>&1 || fail "relinking with $archive failed: $(tail -5 link.log)"
! nm -D --undefined-only "$relinked" | grep -q "GLIBCXX" || fail "the relinked binary still imports a shared libstdc++"
ok "dstrain relinked with a static libstdc++ ($archive)"

expect_status 0 "$SRC/scripts/check-link.sh" "$relinked"
ok "every C++ runtime symbol is libstdc++'s, none left for libtorch.so"

# The launcher removes its workers' log folder after a passing collective check: remove_all.
expect_status 0 "$relinked" bench comm --nproc-per-node 2 --check
expect_out "82 passed, 0 failed"
ok "bench comm --check exits 0 (it died of SIGSEGV in std::filesystem::remove_all)"
finish
