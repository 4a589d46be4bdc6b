// The job's secret authenticates the store's control values (issue 20): a forged, unsigned,
// moved or oversized value reads as absent; the secret file must be its owner's alone.
#include "catch_torch.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "dstrain/comm/store_auth.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "test_support.h"

using namespace dstrain;

TEST_CASE("store values signed with the job's secret verify; forgeries do not", "[launch]") {
  comm::set_store_secret("0123456789abcdef-the-job-secret");
  const std::string key = "dstrain/run1/0/heartbeat/1";
  const std::string signed_value = comm::sign_store_value(key, "step 12 forward");
  CHECK(signed_value.rfind("dstrain-hmac1:", 0) == 0);
  CHECK(comm::verify_store_value(key, signed_value, 1024) == std::string("step 12 forward"));

  const uint64_t before = comm::rejected_store_values();
  CHECK_FALSE(comm::verify_store_value(key, "step 99 forward", 1024));  // a stranger's plain value
  std::string forged = signed_value;
  forged.back() = 'X';  // the value changed, the tag kept
  CHECK_FALSE(comm::verify_store_value(key, forged, 1024));
  CHECK_FALSE(comm::verify_store_value("dstrain/run1/0/heartbeat/0", signed_value, 1024));                // replayed under another key
  CHECK_FALSE(comm::verify_store_value(key, comm::sign_store_value(key, std::string(5000, 'x')), 1024));  // oversized
  comm::set_store_secret("another-secret-entirely-1234");
  CHECK_FALSE(comm::verify_store_value(key, signed_value, 1024));  // a node with another secret
  CHECK(comm::rejected_store_values() == before + 5);

  comm::set_store_secret("");  // no secret: plain values, as before
  CHECK(comm::sign_store_value(key, "v") == "v");
  CHECK(comm::verify_store_value(key, "v", 16) == std::string("v"));
}

TEST_CASE("the secret comes from the variable, an owner-only file, or is generated for one node", "[launch]") {
  test::TempDir dir;
  ::unsetenv(comm::kSecretVariable);
  ::unsetenv(comm::kSecretFileVariable);
  CHECK(comm::store_secret_from_environment(false).empty());
  const std::string a = comm::store_secret_from_environment(true), b = comm::store_secret_from_environment(true);
  CHECK(a.size() == 64);
  CHECK(a != b);
  const std::string file = dir.path() + "/secret";
  write_file_atomic(file, "a-secret-of-enough-length\n");
  ::chmod(file.c_str(), 0644);
  ::setenv(comm::kSecretFileVariable, file.c_str(), 1);
  try {
    (void)comm::store_secret_from_environment(false);
    FAIL("a world-readable secret file was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kEnvironment);
    CHECK_THAT(e.hint(), Catch::Contains("chmod 600"));
  }
  ::chmod(file.c_str(), 0600);
  CHECK(comm::store_secret_from_environment(false) == "a-secret-of-enough-length");
  ::setenv(comm::kSecretVariable, "from-the-variable-123", 1);
  CHECK(comm::store_secret_from_environment(false) == "from-the-variable-123");
  ::unsetenv(comm::kSecretVariable);
  ::unsetenv(comm::kSecretFileVariable);
}
