// The training device's pure parts: the spec, the datasheet table for MFU, the activation
// estimate, and the out-of-memory message and hint.
#include "catch_torch.h"

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/device/pinned_memory.h"
#include "dstrain/device/training_device.h"
#include "dstrain_cuda.h"

using namespace dstrain;

TEST_CASE("device specs: cpu, cuda:N checked against the visible GPUs, anything else refused", "[device]") {
  const device::TrainingDevice cpu = device::open_training_device("cpu", 0);
  CHECK(cpu.device.is_cpu());
  CHECK(cpu.name == "cpu");
  CHECK_THROWS_WITH(device::open_training_device("gpu:0", 3),
                    Catch::Contains("rank 3: DSTRAIN_DEVICE='gpu:0' is neither cpu nor cuda:<index>"));
  CHECK_THROWS_WITH(device::open_training_device("cuda:1x", 0), Catch::Contains("neither cpu nor cuda:<index>"));
  if (dstrain_cuda_device_count() <= 7) {
    try {
      device::open_training_device("cuda:7", 2);
      FAIL("cuda:7 was accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kEnvironment);
      const std::string what = e.what();
      CHECK((what.find("rank 2 was given cuda:7 but only") != std::string::npos || what.find("built without CUDA") != std::string::npos));
    }
  }
}

TEST_CASE("MFU peaks: dense datasheet values by GPU name and dtype, 0 for unknown GPUs", "[device]") {
  CHECK(device::datasheet_peak_tflops("NVIDIA H200", config::Dtype::kBf16) == Approx(989.4));
  CHECK(device::datasheet_peak_tflops("NVIDIA H100 80GB HBM3", config::Dtype::kFp16) == Approx(989.4));
  CHECK(device::datasheet_peak_tflops("NVIDIA H100 PCIe", config::Dtype::kBf16) == Approx(756.5));  // the variant before its family
  CHECK(device::datasheet_peak_tflops("NVIDIA H200", config::Dtype::kFp32) == Approx(66.9));
  CHECK(device::datasheet_peak_tflops("NVIDIA A100-SXM4-80GB", config::Dtype::kBf16) == Approx(312.0));
  CHECK(device::datasheet_peak_tflops("NVIDIA A10G", config::Dtype::kBf16) == Approx(70.0));
  CHECK(device::datasheet_peak_tflops("NVIDIA GeForce GTX 1080", config::Dtype::kBf16) == 0);
  CHECK(device::device_memory_peaks(c10::Device(c10::kCPU)).allocated_mb < 0);
  CHECK(device::measured_gpu_peak_tflops(c10::Device(c10::kCPU), config::Dtype::kBf16) == 0);
}

TEST_CASE("activation estimate: 34 H bytes per token and layer at 16 bits, + scores with a document mask, + logits", "[config]") {
  config::Recipe r;
  r.model.hidden_size = 64, r.model.num_layers = 2, r.model.num_heads = 4, r.model.vocab_size = 256;
  r.train.micro_batch_size = 8, r.data.seq_len = 128, r.precision.dtype = config::Dtype::kBf16;
  r.train.loss_chunk_tokens = 0;  // the full logits
  const double tokens = 8.0 * 128;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * 34 * 64 + tokens * 256 * (4 + 4 + 2)));
  r.precision.dtype = config::Dtype::kFp32;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * 34 * 64 * 2 + tokens * 256 * (4 + 4 + 4)));
  r.data.document_mask = true;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * (34 * 64 + 5 * 4 * 128) * 2 + tokens * 256 * 12));
  // Chunked loss: one chunk's logits (bf16, fp32, bf16 gradient), the hidden gradient, the fp32 head gradient.
  r.data.document_mask = false, r.precision.dtype = config::Dtype::kBf16, r.train.loss_chunk_tokens = 100;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * 34 * 64 + 100 * 256 * (2 + 4 + 2) + tokens * 64 * 2 + 256 * 64 * 4));
  // Recompute: full keeps each layer's input plus one layer's activations; selective the GEMM outputs.
  const double head = 100 * 256 * (2 + 4 + 2) + tokens * 64 * 2 + 256 * 64 * 4;
  r.train.activation_checkpointing = config::Recompute::kFull;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * 64 * 2 + tokens * 34 * 64 + head));
  r.train.activation_checkpointing = config::Recompute::kSelective;
  CHECK(cost::activation_bytes_estimate(r) == Approx(2 * tokens * 26 * 64 + head));
}

TEST_CASE("memory plan: model states, activations and offload staging per rank; the largest model that fits", "[config]") {
  config::Recipe r;
  r.model.hidden_size = 64, r.model.num_layers = 2, r.model.num_heads = 4, r.model.vocab_size = 256, r.model.intermediate_size = 172;
  r.train.micro_batch_size = 8, r.data.seq_len = 128, r.precision.dtype = config::Dtype::kBf16;
  r.launch.nproc_per_node = 4, r.zero.stage = 2;
  const double psi = static_cast<double>(cost::parameter_counts(r.model).total);
  cost::MemoryPlan plan = cost::memory_plan(r);
  CHECK(plan.device_states == Approx(psi * (2 + 2.0 / 4 + 12.0 / 4)));
  CHECK(plan.device_activations == Approx(cost::activation_bytes_estimate(r)));
  CHECK(plan.device_staging == 0);
  CHECK(plan.host_total() == 0);
  const double gib80 = 80.0 * 1073741824.0;
  CHECK(cost::largest_model_fitting(r, gib80) == Approx((0.9 * gib80 - plan.device_activations) / (2 + 2.0 / 4 + 12.0 / 4)));
  // Offloaded: the states move to the host; the step stages the updated bf16 shard on the
  // device, and the bf16 gradient shard in pinned host memory.
  r.zero.offload_optimizer = config::OffloadDevice::kCpu;
  plan = cost::memory_plan(r);
  CHECK(plan.device_states == Approx(psi * (2 + 2.0 / 4)));
  CHECK(plan.device_staging == Approx(psi / 4 * 2));
  CHECK(plan.host_states == Approx(psi * 12.0 / 4));
  CHECK(plan.host_staging == Approx(psi / 4 * 2));
  // Stage 3 with offload_param: the parameter shard joins the host's states; the device holds the
  // gathered groups (the running one and the prefetched one; a decoder layer is the largest here).
  r.zero.stage = 3, r.zero.offload_param = config::OffloadDevice::kCpu;
  plan = cost::memory_plan(r);
  CHECK(plan.device_states == Approx(psi * 2.0 / 4));
  CHECK(plan.host_states == Approx(psi * (2.0 + 12.0) / 4));
  const double layer = (psi - 2.0 * 256 * 64) / 2;
  REQUIRE(layer > 256 * 64);
  CHECK(plan.device_staging == Approx(2.0 * layer * 2));
  CHECK(plan.host_staging == Approx(psi / 4 * 2));
  // The delayed update stages its bf16 parameters on the host too.
  r.zero.delayed_update = true;
  CHECK(cost::memory_plan(r).host_staging == Approx(psi / 4 * 2 * 2));
  r.zero.delayed_update = false;
  // Activations alone beyond the GPU: nothing fits.
  CHECK(cost::largest_model_fitting(r, plan.device_activations) == 0);
}

TEST_CASE("out of memory: where, the per-rank estimate, and the biggest lever first", "[device]") {
  config::Recipe r;
  r.model.hidden_size = 64, r.model.num_layers = 2, r.model.num_heads = 4, r.model.vocab_size = 256, r.model.intermediate_size = 172;
  r.data.seq_len = 128, r.precision.dtype = config::Dtype::kBf16, r.zero.stage = 0;
  device::TrainingDevice gpu;
  gpu.device = c10::Device(c10::kCUDA, 1), gpu.name = "NVIDIA H200", gpu.memory_gib = 139.8;
  const std::string m = device::out_of_memory_message(r, gpu, "backward of step 12", "CUDA out of memory. Tried to allocate 2.00 GiB");
  CHECK_THAT(
      m, Catch::StartsWith(
             "out of memory on cuda:1 (NVIDIA H200, 139.8 GiB) in backward of step 12: CUDA out of memory. Tried to allocate 2.00 GiB."));
  CHECK_THAT(m, Catch::Contains("of model state on the GPU (ZeRO stage 0, bf16)"));
  CHECK_THAT(m, Catch::Contains("GiB of activations for a micro-batch of"));
  // A big micro-batch: the activations dominate, so the batch comes first.
  r.train.micro_batch_size = 512;
  CHECK_THAT(device::out_of_memory_hint(r), Catch::StartsWith("lower train.micro_batch_size (now 512;"));
  CHECK_THAT(device::out_of_memory_hint(r), Catch::Contains("or set train.activation_checkpointing: full (now none;"));
  CHECK_THAT(device::out_of_memory_hint(r),
             Catch::Contains("first: activations are most of it; then raise zero.stage (now 0) or set zero.offload_optimizer: cpu"));
  // A small one with a big model: the model state dominates, so ZeRO and offload come first.
  r.train.micro_batch_size = 1, r.data.seq_len = 8, r.model.hidden_size = 4096, r.model.intermediate_size = 11008, r.model.num_layers = 32;
  CHECK_THAT(device::out_of_memory_hint(r), Catch::StartsWith("raise zero.stage (now 0) or set zero.offload_optimizer: cpu"));
  // Already at stage 3 with offload: only the batch is left.
  r.zero.stage = 3, r.zero.offload_optimizer = config::OffloadDevice::kCpu;
  CHECK_THAT(device::out_of_memory_hint(r), Catch::StartsWith("lower train.micro_batch_size (now 1;"));
  CHECK_THAT(device::out_of_memory_hint(r), !Catch::Contains("zero.stage"));
}

TEST_CASE("pinned host memory of the exact size, or an error that says how to go without it", "[device]") {
  if (dstrain_cuda_device_count() > 0) {
    // With a GPU (test/gpu runs it too): pinned, exactly the size asked for, usable for async copies.
    const at::Tensor t = device::pinned_empty(1000003, at::kBFloat16, "a test buffer");
    CHECK(t.numel() == 1000003);
    CHECK(t.storage().nbytes() == 2000006u);
    CHECK(t.is_pinned());
    return;
  }
  try {
    device::pinned_empty(1024, at::kFloat, "the offloaded fp32 master weights");
    FAIL("pinning succeeded without a GPU");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kEnvironment);
    CHECK_THAT(std::string(e.what()), Catch::Contains("could not pin 4.0 KiB of host memory for the offloaded fp32 master weights"));
    CHECK_THAT(e.hint(), Catch::Contains("zero.pin_memory: false"));
  }
}
