# DSTRAIN_CUDA=AUTO builds cuda/ when nvcc is found and LibTorch was built with CUDA.
# The result is DSTRAIN_WITH_CUDA (ON/OFF). NCCL comes from the CUDA toolkit install.
set(DSTRAIN_WITH_CUDA OFF)
set(_torch_has_cuda OFF)
if(TORCH_CUDA_LIBRARIES)
  set(_torch_has_cuda ON)
endif()
include(CheckLanguage)
check_language(CUDA)
if(DSTRAIN_CUDA STREQUAL "ON" OR (DSTRAIN_CUDA STREQUAL "AUTO" AND CMAKE_CUDA_COMPILER AND _torch_has_cuda))
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "DSTRAIN_CUDA=ON but no nvcc was found. Install the CUDA toolkit or pass -DDSTRAIN_CUDA=OFF.")
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # NCCL: NCCL_HOME, then the CUDA toolkit, then the nvidia-nccl wheel that the CUDA torch
  # wheel depends on (site-packages/nvidia/nccl, which ships only libnccl.so.2).
  get_filename_component(_site_packages "${TORCH_INSTALL_PREFIX}" DIRECTORY)
  set(_nccl_wheel "${_site_packages}/nvidia/nccl")
  find_path(DSTRAIN_NCCL_INCLUDE_DIR nccl.h
    HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS} ${_nccl_wheel}/include)
  find_library(DSTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR} ${_nccl_wheel}/lib)
  if(NOT DSTRAIN_NCCL_INCLUDE_DIR OR NOT DSTRAIN_NCCL_LIBRARY)
    if(DSTRAIN_CUDA STREQUAL "ON")
      message(FATAL_ERROR "CUDA build without NCCL: set NCCL_HOME or pass -DDSTRAIN_CUDA=OFF.")
    endif()
    message(WARNING "dstrain: nvcc and a CUDA LibTorch were found but not NCCL (looked in NCCL_HOME, "
      "${CUDAToolkit_INCLUDE_DIRS}, ${_nccl_wheel}); building without the GPU path. Set NCCL_HOME to enable it.")
    return()
  endif()
  set(DSTRAIN_WITH_CUDA ON)
endif()
message(STATUS "dstrain: CUDA kernels ${DSTRAIN_WITH_CUDA} (DSTRAIN_CUDA=${DSTRAIN_CUDA}, nvcc=${CMAKE_CUDA_COMPILER}, CUDA LibTorch=${_torch_has_cuda}, NCCL=${DSTRAIN_NCCL_LIBRARY})")
