#pragma once
// What a render of a whole conversation observed that a render of only its first k messages would
// have observed differently, so that the render can be resumed at message k of a loop over the
// messages as that prefix's render (jinja.h's ChatTemplate::prefixes).
//
// The argument: the interpreter is deterministic, so a render of messages[:k] takes the same steps
// as the whole render for as long as neither has looked at message k or later, nor at how many
// messages there are. A top-level loop over the messages looks at message j in its iteration j (a
// unit here); such a unit that changed nothing (no output, no namespace write, no break) leaves the
// same state whether it ran or not. So at the start of iteration k of a top-level loop, the whole
// render's state is the prefix's state at that loop's end when: no observation outside the units,
// and none inside a unit for a message before k, reached message k or the count; and no unit for
// message k or later changed anything. What follows the loop is then rendered again from that
// state, with the prefix as `messages`.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "dstrain/text/jinja/value.h"

namespace dstrain::text::jinja {

class PrefixTracker {
 public:
  explicit PrefixTracker(size_t messages);
  size_t messages() const { return n_; }

  // The messages list (offset 0) and its slices messages[o:], by the address of their items.
  void track_list(const Value& list, size_t offset);
  // The offset of a tracked list; -1 for any other value.
  int64_t offset_of(const Value& v) const;

  // The render looked at message i (messages() or more: at the count, or at everything).
  void observe(size_t i);
  void observe_all() { observe(n_); }
  void observe_generation_prompt() { generation_prompt_seen_ = true; }
  // A change that resuming cannot reproduce (a namespace the top-level scope does not hold).
  void untracked_change() { untracked_ = true; }

  // One unit: an iteration, or a filter test, of a top-level loop over the messages, for message i.
  void begin_unit(size_t i);
  void end_unit(bool changed_something);
  bool in_unit() const { return unit_ >= 0; }

  // Whether the render so far is the render of the first k messages so far (see above).
  bool resumable(size_t k) const;
  bool generation_prompt_seen() const { return generation_prompt_seen_; }

 private:
  int64_t max_observed_before(size_t k) const;  // over units for messages before k

  size_t n_;
  std::map<const List*, size_t> lists_;
  std::vector<Value> kept_;  // tracked slices, kept alive so that their addresses are not reused
  int64_t outside_ = -1;     // the furthest message observed outside units
  int64_t unit_ = -1, unit_observed_ = -1;
  std::vector<int64_t> tree_;  // Fenwick tree: the furthest message observed, by unit message, prefix maxima
  int64_t last_changing_unit_ = -1;
  bool untracked_ = false, generation_prompt_seen_ = false;
};

}  // namespace dstrain::text::jinja
