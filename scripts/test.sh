#!/usr/bin/env bash
# Sets up, builds and runs the test suite (every label but gpu). Extra arguments go to ctest:
#   scripts/test.sh                 everything CI runs
#   scripts/test.sh -L unit         only unit tests
#   scripts/test.sh -R cli          only tests whose name matches 'cli'
#   DSTRAIN_TEST_JOBS=1 scripts/test.sh   one test at a time (default 2: the unit, model and
#                                   fuzz tests in pairs; multi-process tests always run alone)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/setup.sh" --test
"$DSTRAIN_ROOT/scripts/build.sh"
[ -x "$DSTRAIN_BUILD_DIR/test/dstrain_unit_tests" ] || die "the unit tests were not built (is catch2 installed? scripts/setup.sh --test)"
say "running tests"
cd "$DSTRAIN_BUILD_DIR"
ctest --output-on-failure -LE gpu --timeout 600 -j "${DSTRAIN_TEST_JOBS:-2}" "$@"
