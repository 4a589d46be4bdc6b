#pragma once
// The end of a process in a defined order (issue 17). Steps run once, in the order they were
// added, each even when an earlier one failed; the first failure is rethrown after the last step.
// A worker adds: join its threads, flush its files, synchronize the device, free its tensors and
// the allocator's cache, destroy its communicators — so nothing of LibTorch, NCCL, Gloo or CUDA
// is left for static destructors and exit handlers, whose order nobody controls.
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace dstrain {

class ShutdownSequence {
 public:
  void add(std::string name, std::function<void()> step);
  // Runs every step (once per sequence); rethrows the first step's exception, if any.
  void run();
  // Runs every step and swallows failures: for destructors, while another error unwinds.
  void run_quietly() noexcept;
  bool done() const { return done_; }
  // The steps that have run, in order; a failed one ends with " (failed)".
  const std::vector<std::string>& ran() const { return ran_; }

 private:
  std::exception_ptr run_all();
  std::vector<std::pair<std::string, std::function<void()>>> steps_;
  std::vector<std::string> ran_;
  bool done_ = false;
};

// The threads of this process now (Linux: /proc/self/task), for shutdown checks and tests.
int thread_count();

}  // namespace dstrain
