# Use ccache for C++ and CUDA when it is installed: rebuilds on 2 cores are the common case.
find_program(DSTRAIN_CCACHE ccache)
if(DSTRAIN_CCACHE)
  # Precompiled headers (DstrainPch.cmake) are cached only with these sloppiness settings.
  set(CMAKE_CXX_COMPILER_LAUNCHER "${CMAKE_COMMAND}" -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "${DSTRAIN_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${DSTRAIN_CCACHE}")
endif()
