# The one place where pinned versions live. Sourced by the other scripts.
# LibTorch comes from the torch wheel on PyPI. 2.11.0 is also the version on the GPU machines,
# and its wheel targets CUDA 13.0, the toolkit installed on the build machines.
DSTRAIN_TORCH_VERSION="2.11.0"
# Python packages beside torch for every user: TensorBoard, which `dstrain tensorboard` runs, and
# pyarrow, whose wheel carries the Arrow/Parquet C++ libraries and headers that prepare-data's
# Parquet plugin is built against (any version builds: the plugin takes the C++ standard its headers
# need, C++17 for 21, C++20 for 26; cmake/DstrainParquet.cmake).
DSTRAIN_PY_PACKAGES="tensorboard pyarrow==21.0.0"
# transformers (with tokenizers): the fine-tuning demo (scripts/demo.sh --sft) trains its tokenizer
# with it and chats with the exported model through it (scripts/setup.sh --sft).
DSTRAIN_PY_SFT_PACKAGES="transformers==5.24.0"
# Python packages the tests use as independent references (scripts/setup.sh --test, into the
# same venv): transformers loads dstrain's exports and gives reference logits (YaRN, DeepSeek
# V2/V3); the tests also read TensorBoard's event files with tensorboard itself, and the wandb and
# mlflow sinks' offline runs with the Weights & Biases and MLflow SDKs (which users install
# themselves where they want those sinks); PEFT loads LoRA exports and gives the reference loss.
DSTRAIN_PY_TEST_PACKAGES="numpy jsonschema $DSTRAIN_PY_SFT_PACKAGES wandb==0.31.0 mlflow-skinny==3.18.0 peft==0.21.2 bitsandbytes==0.50.2"
# TRL, the reference for train.objective dpo (test/dist/dpo_reference.py), in an overlay virtualenv
# beside the torch one ($DSTRAIN_TRL_VENV: it sees the torch venv's packages through a .pth file):
# TRL needs datasets, whose releases need pyarrow >= 24, while the Parquet plugin is built against
# the torch venv's pyarrow==21.0.0; the overlay keeps the two apart.
DSTRAIN_PY_TRL_PACKAGES="trl==1.16.0"
# lm-evaluation-harness, the reference for `dstrain eval --task` (test/dist/choice_task_reference.py),
# in the same overlay without its dependencies: the reference uses its HFLM's tokenization and
# loglikelihood, which need only torch, transformers, accelerate and peft (there already); its
# own list adds scikit-learn, scipy, nltk and sacrebleu for metrics the tests do not read.
DSTRAIN_PY_LMEVAL_PACKAGE="lm_eval==0.4.13"
