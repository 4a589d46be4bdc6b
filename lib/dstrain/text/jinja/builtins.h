#pragma once
// Jinja2's built-in filters and tests, the Python methods of strings, lists and dicts that chat
// templates call, and the globals transformers gives them (raise_exception, range, namespace,
// strftime_now). A name outside these is refused by the interpreter, never guessed.
#include <string>

#include "dstrain/text/jinja/value.h"

namespace dstrain::text::jinja {

// Each returns false when `name` is not one it knows. Errors are thrown as std::invalid_argument
// with Python's wording; the interpreter adds where.
bool apply_filter(const std::string& name, const Value& value, Arguments& args, Value& out);
bool apply_test(const std::string& name, const Value& value, Arguments& args, bool& out);
// Whether a filter or test of that name exists (the parser refuses others where they are written).
bool is_filter(const std::string& name);
bool is_test(const std::string& name);
// A bound method (`'a b'.split`, `message.items`), or undefined when the object has none by that name.
Value method_of(const Value& object, const std::string& name);
// The globals every template sees (raise_exception throws std::runtime_error with its message,
// prefixed "raise_exception: ").
Dict template_globals();

}  // namespace dstrain::text::jinja
