#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating the rendezvous store's
// control values with the job's secret. Small and dependency-free; checked against the NIST and
// RFC 4231 test vectors.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dstrain {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);
std::string to_hex(const Sha256Digest& digest);
// Equality in time independent of where the first difference is.
bool digests_equal(const Sha256Digest& a, const Sha256Digest& b);

}  // namespace dstrain
