#pragma once
// c10d logs to stderr by itself what dstrain reports with a hint: a node that cannot reach node 0
// got an error line and a warning carrying a C++ backtrace of 17 frames, retry after retry. Those
// lines stay off unless TORCH_CPP_LOG_LEVEL asks for them (INFO, WARNING or ERROR), as in PyTorch.
namespace dstrain::comm {

void quiet_torch_logging();

}  // namespace dstrain::comm
