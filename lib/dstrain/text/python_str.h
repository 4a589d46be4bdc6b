#pragma once
// Python's str methods where task files must mean what lm-evaluation-harness's Python makes of
// them: whitespace as str.isspace() sees it, strip, lower, and string.punctuation.
#include <cstddef>
#include <string>

namespace dstrain::text {

bool is_python_space(char32_t c);  // str.isspace()
// Where the trailing whitespace of `s` begins: len(s.rstrip()), in bytes.
size_t python_rstrip_end(const std::string& s);
std::string python_strip(const std::string& s);  // str.strip()
// str.lower(), one code point to one (utf8proc's simple mapping: Python's few one-to-many
// lowerings, as of U+0130, keep one code point).
std::string python_lower(const std::string& s);
// s.translate(str.maketrans("", "", string.punctuation)): ASCII punctuation removed.
std::string remove_ascii_punctuation(const std::string& s);

}  // namespace dstrain::text
