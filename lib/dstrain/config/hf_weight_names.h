#pragma once
// Whether a Hugging Face folder's weights hold a tensor, from model.safetensors' header or
// model.safetensors.index.json alone (no tensor is read): the config asks it before it decides
// what to train from them (e.g. MTP modules that config.json names but the weights lack).
#include <string>

namespace dstrain::config {

// True when DIR's weights name `tensor`; false too when DIR has no readable weights (the weight
// check that follows says what is wrong with them).
bool hf_folder_holds(const std::string& dir, const std::string& tensor);

}  // namespace dstrain::config
