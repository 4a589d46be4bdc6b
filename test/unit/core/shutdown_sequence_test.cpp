// ShutdownSequence (core/shutdown_sequence.h): every step once, in order, the first failure rethrown.
#include "catch_torch.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "dstrain/core/shutdown_sequence.h"

using namespace dstrain;

TEST_CASE("a shutdown sequence runs every step once, in order, and rethrows the first failure", "[core]") {
  std::vector<std::string> order;
  ShutdownSequence s;
  s.add("threads", [&] { order.push_back("threads"); });
  s.add("files", [&] {
    order.push_back("files");
    throw std::runtime_error("disk full");
  });
  s.add("communicators", [&] { order.push_back("communicators"); });
  s.add("memory", [&] {
    order.push_back("memory");
    throw std::runtime_error("second failure");
  });
  CHECK_THROWS_WITH(s.run(), "disk full");  // the first failure, after every step has run
  CHECK(order == std::vector<std::string>{"threads", "files", "communicators", "memory"});
  CHECK(s.ran() == std::vector<std::string>{"threads", "files (failed)", "communicators", "memory (failed)"});
  CHECK(s.done());
  s.run();  // once only: nothing runs, nothing is thrown again
  s.run_quietly();
  CHECK(order.size() == 4);
}
