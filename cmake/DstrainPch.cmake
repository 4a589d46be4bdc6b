# ATen's headers are most of a translation unit's compile time (8 s of 9 for a model file on the
# 2-core machines; 2 s with them precompiled), so every target that includes them precompiles
# <ATen/ATen.h> once. Sources that include nothing of LibTorch skip the precompiled header: they
# compile as fast as before and see no ATen. DSTRAIN_PCH=OFF builds without (to check includes).
option(DSTRAIN_PCH "Precompile ATen's headers for the targets that use them" ON)

# (CLI11 in the commands' precompiled header was tried: its 18 s to build cost more than the
# 14 command files saved; their time is CLI11's inline code, not its parsing.)
function(dstrain_precompile_aten target)
  if(NOT DSTRAIN_PCH)
    return()
  endif()
  get_target_property(_sources ${target} SOURCES)
  set(_uses_aten OFF)
  foreach(_src IN LISTS _sources)
    if(_src MATCHES "^\\$<" OR NOT _src MATCHES "\\.cpp$")  # $<TARGET_OBJECTS:...>, headers, .cu
      continue()
    endif()
    get_filename_component(_path "${_src}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    file(STRINGS "${_path}" _torch_includes REGEX "#include [<\"](ATen/|c10/|torch/|catch_torch\\.h)" LIMIT_COUNT 1)
    if(_torch_includes)
      set(_uses_aten ON)
    else()
      set_source_files_properties("${_path}" PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  if(_uses_aten)
    target_precompile_headers(${target} PRIVATE <ATen/ATen.h>)
  endif()
endfunction()
