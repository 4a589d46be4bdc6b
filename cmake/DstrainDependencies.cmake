# Every dependency comes from Debian's packages, except LibTorch, which comes from the torch wheel
# (scripts/setup.sh puts its cmake prefix on CMAKE_PREFIX_PATH). See third_party/README.md.
find_package(Threads REQUIRED)
# Torch's CMake appends its own -gencode list (including archs nvcc 13 no longer knows) to
# CMAKE_CUDA_FLAGS. Our kernels choose their architectures themselves (cmake/DstrainCuda.cmake).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
set(_dstrain_cuda_flags "${CMAKE_CUDA_FLAGS}")
find_package(Torch REQUIRED)
set(CMAKE_CUDA_FLAGS "${_dstrain_cuda_flags}")
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(ZLIB REQUIRED)  # the report's PNG charts, gzip input of prepare-data
# prepare-data's tokenizer: Oniguruma, the regex engine of Hugging Face tokenizers (so patterns
# mean what they mean there), and utf8proc for Unicode normalization (NFC/NFKC) and categories.
find_path(DSTRAIN_ONIG_INCLUDE_DIR oniguruma.h REQUIRED)
find_library(DSTRAIN_ONIG_LIBRARY onig PATH_SUFFIXES x86_64-linux-gnu aarch64-linux-gnu REQUIRED)
find_path(DSTRAIN_UTF8PROC_INCLUDE_DIR utf8proc.h REQUIRED)
find_library(DSTRAIN_UTF8PROC_LIBRARY NAMES libutf8proc.a utf8proc PATH_SUFFIXES x86_64-linux-gnu aarch64-linux-gnu REQUIRED)
# The tests need Catch2 (scripts/setup.sh --test installs it); without it only dstrain is built,
# as scripts/demo.sh does on a machine set up for the demo alone.
if(DSTRAIN_TESTS)
  find_package(Catch2 2 QUIET)
  if(NOT Catch2_FOUND AND DSTRAIN_TESTS_REQUIRED)
    message(FATAL_ERROR "Catch2 was not found and DSTRAIN_TESTS_REQUIRED is on: install catch2 (scripts/setup.sh --test)")
  elseif(NOT Catch2_FOUND)
    message(STATUS "dstrain: Catch2 not found: the tests are not configured (scripts/setup.sh --test installs it)")
    set(DSTRAIN_TESTS OFF)
  endif()
endif()
# gloo's headers: the torch wheel ships ProcessGroupGloo.hpp but not the gloo headers it includes.
# Debian's libgloo-dev provides them; only c10d translation units see them, nothing links libgloo.
find_path(DSTRAIN_GLOO_INCLUDE_DIR gloo/algorithm.h REQUIRED)

# The torch wheel bundles fmt 12 headers in its include dir, which comes before /usr/include.
# Our code uses Debian's fmt (and links libfmt), so give it an include dir that wins over torch's.
# c10d translation units (lib/dstrain/c10d) keep torch's fmt: the two live in different inline
# namespaces (fmt::v9, fmt::v12) and never meet.
set(DSTRAIN_FMT_SHIM "${CMAKE_BINARY_DIR}/fmt-shim")
get_target_property(_fmt_inc fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
file(MAKE_DIRECTORY "${DSTRAIN_FMT_SHIM}")
file(CREATE_LINK "${_fmt_inc}/fmt" "${DSTRAIN_FMT_SHIM}/fmt" SYMBOLIC)

# Torch's flags (e.g. -D_GLIBCXX_USE_CXX11_ABI) are carried by the imported torch target.

# The torch wheel's libtorch.so exports its own copy of libstdc++'s std::filesystem (remove_all,
# resize_file, ...), whose remove_all jumps to a null pointer when another program calls it. No
# reference of dstrain's may ever bind to it (issue 17: every GPU run that pruned a checkpoint or
# cleaned up a log directory died of SIGSEGV at its end):
#  - a shared libstdc++ (Debian): named before any other library (link options precede objects
#    and libraries), it is first in DT_NEEDED and every std:: reference is versioned GLIBCXX_*;
#  - a static one (a toolchain with only libstdc++.a, as the H200 machine's /opt/gcc): the option
#    takes nothing from the archive (no object has been read yet), and the compiler's own
#    -lstdc++ comes after libtorch.so, which would then satisfy those references. So libstdc++ is
#    also a link library right after dstrain's own and before torch.
# scripts/check-link.sh (test unit.check_link) fails on any std:: symbol left for another library.
add_library(dstrain_stdcxx_first INTERFACE)
target_link_options(dstrain_stdcxx_first INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
target_link_libraries(dstrain_stdcxx_first INTERFACE stdc++)
