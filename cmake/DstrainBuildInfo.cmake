# Generates build_info.cpp with what `dstrain --version` prints. The git commit is read at
# configure time and refreshed on each build by a small script, so ccache hits stay exact.
find_package(Git QUIET)
set(DSTRAIN_BUILD_INFO_CPP "${CMAKE_BINARY_DIR}/generated/build_info.cpp")
add_custom_target(dstrain_git_commit
  COMMAND ${CMAKE_COMMAND} -DGIT=${GIT_EXECUTABLE} -DSRC=${CMAKE_SOURCE_DIR}
          -DOUT=${CMAKE_BINARY_DIR}/generated/git_commit.h -P ${CMAKE_SOURCE_DIR}/cmake/WriteGitCommit.cmake
  BYPRODUCTS ${CMAKE_BINARY_DIR}/generated/git_commit.h
  COMMENT "" VERBATIM)
set(DSTRAIN_COMPILER "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
set(DSTRAIN_TORCH_VERSION_STR "${Torch_VERSION}")
# The virtualenv of the torch wheel (site-packages/torch -> ../../../../bin), where setup.sh puts tensorboard.
get_filename_component(DSTRAIN_PYTHON_BIN_DIR "${TORCH_INSTALL_PREFIX}/../../../../bin" ABSOLUTE)
if(NOT EXISTS "${DSTRAIN_PYTHON_BIN_DIR}/python")
  set(DSTRAIN_PYTHON_BIN_DIR "")
endif()
configure_file("${CMAKE_SOURCE_DIR}/cmake/build_info.cpp.in" "${DSTRAIN_BUILD_INFO_CPP}" @ONLY)
