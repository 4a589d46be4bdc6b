#pragma once
// The training step's reads of device values to the host, through one function so that they can
// be counted: a step reads its sums once (zero::Engine::step's all-reduce), whatever its number
// of micro-batches (train/step_runner.h). On a GPU each read waits for the queued work.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dstrain::device {

// `values` (any dtype and device) as float64 on the host; counted.
std::vector<double> read_to_host(const at::Tensor& values);
// `values` as a float64 tensor on `device`. On a GPU the copy leaves from pinned memory without
// waiting for the queued work (the step's host sums go up once per step; a pageable copy would
// wait for the device).
at::Tensor send_to_device(const std::vector<double>& values, const c10::Device& device);
// How many reads this process has made (tests).
int64_t host_reads();

}  // namespace dstrain::device
