#include "dstrain/comm/store_auth.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/sha256.h"

namespace dstrain::comm {
namespace {

constexpr const char* kPrefix = "dstrain-hmac1:";
constexpr size_t kPrefixSize = 14, kTagSize = 64;

std::mutex g_mutex;
std::string g_secret;
std::atomic<uint64_t> g_rejected{0};

std::string secret() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_secret;
}

std::string tag(const std::string& key_secret, const std::string& key, const std::string& value) {
  std::string message = key;
  message += '\0';
  message += value;
  return to_hex(hmac_sha256(key_secret, message));
}

std::optional<std::string> reject(const std::string& key, const char* why) {
  const uint64_t n = ++g_rejected;
  if (n == 1 || n % 100 == 0)
    log::warn(
        fmt::format("rendezvous store: ignored {} value(s) so far; the latest under {}: {} (another program is writing into "
                    "this job's store, or a node has another {})",
                    n, key, why, kSecretVariable));
  return std::nullopt;
}

}  // namespace

void set_store_secret(std::string s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_secret = std::move(s);
}

bool store_authenticated() { return !secret().empty(); }

std::string sign_store_value(const std::string& key, const std::string& value) {
  const std::string s = secret();
  if (s.empty()) return value;
  return kPrefix + tag(s, key, value) + ":" + value;
}

std::optional<std::string> verify_store_value(const std::string& key, const std::string& stored, size_t max_bytes) {
  const std::string s = secret();
  const size_t overhead = s.empty() ? 0 : kPrefixSize + kTagSize + 1;
  if (stored.size() > max_bytes + overhead) return reject(key, "larger than any value dstrain writes there");
  if (s.empty()) return stored;
  if (stored.size() < overhead || stored.compare(0, kPrefixSize, kPrefix) != 0 || stored[kPrefixSize + kTagSize] != ':')
    return reject(key, "not signed with the job's secret");
  std::string value = stored.substr(overhead);
  const std::string want = tag(s, key, value);
  uint8_t diff = 0;
  for (size_t i = 0; i < kTagSize; ++i) diff |= static_cast<uint8_t>(want[i] ^ stored[kPrefixSize + i]);
  if (diff != 0) return reject(key, "its signature does not verify");
  return value;
}

uint64_t rejected_store_values() { return g_rejected.load(); }

std::string store_secret_from_environment(bool may_generate) {
  if (const char* v = std::getenv(kSecretVariable); v && *v) return v;
  if (const char* path = std::getenv(kSecretFileVariable); path && *path) {
    struct stat st {};
    if (::stat(path, &st) != 0)
      throw Error(ErrorCode::kEnvironment, fmt::format("{}={}: {}", kSecretFileVariable, path, std::strerror(errno)),
                  "name a file that holds the job's secret on every node");
    if ((st.st_mode & 077) != 0)
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("{}={} can be read by other users (mode {:o})", kSecretFileVariable, path, st.st_mode & 0777),
                  fmt::format("chmod 600 {}", path));
    std::string text = read_file(path);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
    if (text.size() < 16)
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("{}={} holds {} characters; a secret needs at least 16", kSecretFileVariable, path, text.size()),
                  "e.g. `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`");
    return text;
  }
  if (!may_generate) return "";
  unsigned char bytes[32];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    throw Error(ErrorCode::kEnvironment, std::string("getrandom failed: ") + std::strerror(errno),
                "the kernel's random source is unavailable");
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace dstrain::comm
