#include "catch_torch.h"

#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/zero/loss_scaler.h"

using namespace dstrain::zero;

namespace {
// The scale in force at each step of `pattern` ('.' clean, 'O' overflow), and after the last.
std::vector<double> trajectory(LossScaler& s, const std::string& pattern) {
  std::vector<double> out;
  for (char c : pattern) {
    out.push_back(s.scale());
    s.update(c == 'O');
  }
  out.push_back(s.scale());
  return out;
}
}  // namespace

// The cases of DeepSpeed's tests and ../shared/docs/reference/deepspeed-semantics.md section 3.
TEST_CASE("loss scaler: doubles after the 3rd clean step, then every window (init 2^8, window 2)", "[zero]") {
  LossScaler s({0, 8, 2, 1, false, 1});
  CHECK(trajectory(s, "......") == std::vector<double>{256, 256, 256, 512, 512, 1024, 1024});
}

TEST_CASE("loss scaler: every step overflowing from 2^4 halves down to the minimum (hysteresis 1)", "[zero]") {
  LossScaler s({0, 4, 1000, 1, false, 1});
  CHECK(trajectory(s, "OOOO") == std::vector<double>{16, 8, 4, 2, 1});
  CHECK_THROWS_AS(s.update(true), dstrain::Error);  // at the minimum: DeepSpeed exits
}

TEST_CASE("loss scaler: the ZeRO trace with hysteresis 2, window 2", "[zero]") {
  LossScaler s({0, 4, 2, 2, false, 1});
  // After each step of .....OOO.O... : 16,16,32,32,64 | 64 (hysteresis->1), 32, 16 | 16 | 8 | 8, 8, 16
  const auto t = trajectory(s, ".....OOO.O...");
  CHECK(t == std::vector<double>{16, /* after: */ 16, 16, 32, 32, 64, 64, 32, 16, 16, 8, 8, 8, 16});
}

TEST_CASE("loss scaler: persistent overflow from 4 with min 1 ends in an error on the 4th", "[zero]") {
  LossScaler s({0, 2, 1000, 2, false, 1});
  s.update(true);  // hysteresis 2 -> 1
  CHECK(s.scale() == 4);
  s.update(true);
  CHECK(s.scale() == 2);
  s.update(true);
  CHECK(s.scale() == 1);
  try {
    s.update(true);
    FAIL("no error at the minimum scale");
  } catch (const dstrain::Error& e) {
    CHECK(e.code() == dstrain::ErrorCode::kDiverged);
    CHECK(std::string(e.what()).find("minimum loss scale") != std::string::npos);
  }
}

TEST_CASE("loss scaler: consecutive hysteresis refills after every clean step", "[zero]") {
  LossScaler s({0, 4, 100, 2, true, 1});
  CHECK(trajectory(s, "O.O.O") == std::vector<double>{16, 16, 16, 16, 16, 16});
  LossScaler plain({0, 4, 100, 2, false, 1});
  CHECK(trajectory(plain, "O.O.O") == std::vector<double>{16, 16, 16, 8, 8, 4});
}

TEST_CASE("loss scaler: a static scale never moves; state round-trips", "[zero]") {
  LossScaler s({128, 16, 2, 2, false, 1});
  CHECK_FALSE(s.dynamic());
  CHECK(trajectory(s, "OO....") == std::vector<double>(7, 128));
  LossScaler a({0, 4, 2, 2, false, 1});
  trajectory(a, "..O.");
  LossScaler b({0, 4, 2, 2, false, 1});
  b.set_state(a.state());
  CHECK(trajectory(a, "...O..") == trajectory(b, "...O.."));
}
