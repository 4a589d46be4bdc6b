#pragma once
// Catch2 for tests that also use LibTorch. c10/util/Logging.h defines a glog-style CHECK that
// aborts the whole test binary on failure; included after Catch, it silently replaces Catch's
// CHECK. Here c10's header comes first (its include guard keeps it from coming back) and its
// CHECK is dropped, so CHECK is always Catch's: a failure is reported, and the tests go on.
// Every test includes this instead of <catch2/catch.hpp> (scripts/check-modules.sh enforces it).
#include <c10/util/Logging.h>
#undef CHECK
#include <catch2/catch.hpp>
