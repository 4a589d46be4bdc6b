# The one place where pinned versions live. Sourced by the other scripts.
# LibTorch comes from the torch wheel on PyPI. 2.11.0 is also the version on the GPU machines,
# and its wheel targets CUDA 13.0, the toolkit installed on the build machines.
DSTRAIN_TORCH_VERSION="2.11.0"
# Python packages the tests use as independent references (installed into the same venv):
# transformers loads dstrain's exports and gives reference logits (YaRN, DeepSeek V2/V3).
DSTRAIN_PY_TEST_PACKAGES="numpy jsonschema tensorboard transformers==5.24.0"
