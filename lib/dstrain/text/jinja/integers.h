#pragma once
// Python's integer arithmetic on 64 bits: floor division and modulo round toward negative
// infinity, and a result that Python would hold as a big integer (2**64, -(-2**63), 2**63 * 2)
// is refused (std::invalid_argument, which the interpreter reports at the template's line)
// instead of wrapping around or trapping (INT64_MIN // -1 is SIGFPE in C++).
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dstrain::text::jinja {

[[noreturn]] inline void integer_overflow(const char* op) {
  throw std::invalid_argument(std::string("integer overflow in ") + op +
                              ": the result needs more than 64 bits (Python's integers are unbounded; dstrain's templates refuse it)");
}

inline int64_t py_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) integer_overflow("+");
  return r;
}
inline int64_t py_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) integer_overflow("-");
  return r;
}
inline int64_t py_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) integer_overflow("*");
  return r;
}
inline int64_t py_neg(int64_t a) { return py_sub(0, a); }

// b != 0 (the caller reports division by zero).
inline int64_t py_floordiv(int64_t a, int64_t b) {
  if (b == -1 && a == INT64_MIN) integer_overflow("//");
  if (b == -1) return -a;
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}
inline int64_t py_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// e >= 0.
inline int64_t py_pow(int64_t base, int64_t e) {
  int64_t result = 1;
  while (e > 0) {
    if (e & 1) {
      if (__builtin_mul_overflow(result, base, &result)) integer_overflow("**");
    }
    e >>= 1;
    if (e > 0 && __builtin_mul_overflow(base, base, &base)) integer_overflow("**");
  }
  return result;
}

}  // namespace dstrain::text::jinja
