# Use ccache for C++ and CUDA when it is installed: rebuilds on 2 cores are the common case.
find_program(DSTRAIN_CCACHE ccache)
if(DSTRAIN_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${DSTRAIN_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${DSTRAIN_CCACHE}")
endif()
