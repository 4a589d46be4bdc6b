# The one place where pinned versions live. Sourced by the other scripts.
# LibTorch comes from the torch wheel on PyPI. 2.11.0 is also the version on the GPU machines,
# and its wheel targets CUDA 13.0, the toolkit installed on the build machines.
DSTRAIN_TORCH_VERSION="2.11.0"
# Python packages beside torch for every user: TensorBoard, which `dstrain tensorboard` runs, and
# pyarrow, whose wheel carries the Arrow/Parquet C++ libraries and headers that prepare-data's
# Parquet plugin is built against (21: Arrow 26's headers need C++20; 21's build as C++17).
DSTRAIN_PY_PACKAGES="tensorboard pyarrow==21.0.0"
# transformers (with tokenizers): the fine-tuning demo (scripts/demo.sh --sft) trains its tokenizer
# with it and chats with the exported model through it (scripts/setup.sh --sft).
DSTRAIN_PY_SFT_PACKAGES="transformers==5.24.0"
# Python packages the tests use as independent references (scripts/setup.sh --test, into the
# same venv): transformers loads dstrain's exports and gives reference logits (YaRN, DeepSeek
# V2/V3); the tests also read TensorBoard's event files with tensorboard itself.
DSTRAIN_PY_TEST_PACKAGES="numpy jsonschema $DSTRAIN_PY_SFT_PACKAGES"
