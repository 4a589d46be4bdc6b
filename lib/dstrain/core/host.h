#pragma once
// This machine's name and the wall clock, as every report and record of dstrain states them.
#include <string>

namespace dstrain {

std::string host_name();  // gethostname(), "" if it fails
double unix_seconds();    // seconds since the epoch, fractional

}  // namespace dstrain
