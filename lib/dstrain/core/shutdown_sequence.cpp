#include "dstrain/core/shutdown_sequence.h"

#include <filesystem>

#include "dstrain/core/log.h"

namespace dstrain {

void ShutdownSequence::add(std::string name, std::function<void()> step) { steps_.emplace_back(std::move(name), std::move(step)); }

std::exception_ptr ShutdownSequence::run_all() {
  std::exception_ptr first;
  if (done_) return first;
  done_ = true;
  for (auto& [name, step] : steps_) {
    log::debug("shutdown: " + name);
    try {
      step();
      ran_.push_back(name);
    } catch (...) {
      ran_.push_back(name + " (failed)");
      if (!first) first = std::current_exception();
    }
  }
  steps_.clear();  // what the steps captured goes now, in this order, not at some later destructor
  return first;
}

void ShutdownSequence::run() {
  if (std::exception_ptr e = run_all()) std::rethrow_exception(e);
}

void ShutdownSequence::run_quietly() noexcept {
  try {
    (void)run_all();
  } catch (...) {}
}

int thread_count() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++n;
  return n;
}

}  // namespace dstrain
