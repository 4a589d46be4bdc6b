#pragma once
// Template source -> syntax tree, with Jinja2's whitespace rules (trim_blocks, lstrip_blocks,
// `-` and `+` modifiers, one trailing newline dropped, line endings normalised to \n).
// Anything outside the supported subset is refused with NAME:LINE:COLUMN, never approximated.
#include <string>

#include "dstrain/text/jinja/ast.h"

namespace dstrain::text::jinja {

struct ParseOptions {
  bool trim_blocks = true, lstrip_blocks = true;
};

// Throws dstrain::Error{kConfig}: "NAME:LINE:COLUMN: what".
Body parse_template(const std::string& source, const std::string& name, const ParseOptions& options);

}  // namespace dstrain::text::jinja
