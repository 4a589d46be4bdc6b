#pragma once
// Files that are either absent or complete: written to a temporary name in the same directory,
// fsync'ed, renamed over the target, and the directory fsync'ed. A crash at any point leaves the
// old file (or none), never a torn one.
#include <string>
#include <string_view>

namespace dstrain {

void write_file_atomic(const std::string& path, std::string_view bytes);
// Renames a finished directory into place and fsyncs the parent (checkpoint commit).
void rename_atomic(const std::string& from, const std::string& to);
void fsync_path(const std::string& path);
// Reads a whole file; throws Error{code} naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace dstrain
