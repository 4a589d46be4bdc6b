#pragma once
// The sandbox's bounds. Chat templates arrive inside downloaded tokenizer_config.json files, and
// conversations inside datasets: neither may crash dstrain (stack overflow, SIGFPE) or take all of
// its memory or time. Each bound is far above what a real template needs for a real conversation
// and is refused with an error naming the template's line, as Jinja2's sandbox does for range().
#include <cstddef>
#include <cstdint>

namespace dstrain::text::jinja {

// Nested brackets, operators and blocks in a template's source.
constexpr int kMaxParseDepth = 200;
// Nested evaluation while rendering: statements, expressions, macro and loop() calls (a macro
// that calls itself reaches about 330 levels; Jinja2 stops near 200, at Python's recursion limit).
constexpr int kMaxRenderDepth = 1000;
// Statements and expressions evaluated in one render, a loop iteration counting as
// kLoopIterationSteps (it costs as much) and a value the template builds as a step per 4 list
// items or 512 bytes: about 3 s of work. A real template renders a 20,000-turn conversation in
// about 200,000.
constexpr int64_t kMaxRenderSteps = 10'000'000;
constexpr int64_t kLoopIterationSteps = 4;
// range()'s length: Jinja2's sandbox MAX_RANGE.
constexpr int64_t kMaxRange = 100'000;
// One string a template builds (s * n, indent, join, replace, ~, +) and a render's whole output.
constexpr size_t kMaxStringBytes = size_t{256} << 20;
// One list a template builds (l * n, l + l).
constexpr size_t kMaxListItems = size_t{1} << 22;
// What the resume points of one conversation's prefix renderings may keep alive (the namespace
// values of the top-level scope at each, counted once each): a template that builds a new string
// per message would otherwise keep every one. Past it, later prefixes are rendered from the start.
constexpr size_t kMaxResumeBytes = size_t{256} << 20;

}  // namespace dstrain::text::jinja
