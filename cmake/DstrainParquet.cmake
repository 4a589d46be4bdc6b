# Parquet input (prepare-data): a plugin dstrain dlopens only for .parquet files, built against
# the Arrow/Parquet C++ libraries a pyarrow wheel carries (headers included). The build never fails
# because of pyarrow:
#   - the plugin is compiled with the C++ standard the wheel's headers need (pyarrow 21's build
#     with C++17, pyarrow 26's need C++20), found by compiling a probe once per wheel; when no
#     standard the compiler has works, the plugin is skipped with one line saying why;
#   - the pyarrow folder, its libraries and its Arrow version header are configure dependencies:
#     `pip install -U pyarrow` (e.g. by `pip install datasets`) makes the next build reconfigure
#     against the new wheel (or skip the plugin when pyarrow is gone), instead of failing on a
#     library file name that no longer exists.
# dstrain_add_parquet_plugin(PYARROW_DIR SOURCE_DIR OUTPUT_DIR) defines the target dstrain_parquet
# (when it can) and sets DSTRAIN_PARQUET_PLUGIN to ON or OFF in the caller's scope.

function(_dstrain_parquet_configure_depends pyarrow_dir)
  # The folder itself: its mtime changes when pip adds or removes files in it (an upgrade, an
  # uninstall); a dependency that disappears makes the next build reconfigure too.
  set(_depends "${pyarrow_dir}")
  if(NOT EXISTS "${pyarrow_dir}")
    get_filename_component(_depends "${pyarrow_dir}" DIRECTORY)  # site-packages: changes when pyarrow comes back
  endif()
  file(GLOB _libs "${pyarrow_dir}/libarrow.so*" "${pyarrow_dir}/libparquet.so*")
  foreach(_f IN LISTS _libs ITEMS "${pyarrow_dir}/include/arrow/util/config.h")
    if(EXISTS "${_f}")
      list(APPEND _depends "${_f}")
    endif()
  endforeach()
  set_property(DIRECTORY "${CMAKE_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_depends})
endfunction()

# The first of C++17 and C++20 in which the wheel's headers compile; "" when neither does.
function(_dstrain_parquet_standard pyarrow_dir out)
  file(SHA256 "${pyarrow_dir}/include/arrow/util/config.h" _version_hash)
  set(_key "DSTRAIN_PARQUET_STD_${_version_hash}")
  if(DEFINED CACHE{${_key}})
    set(${out} "${${_key}}" PARENT_SCOPE)
    return()
  endif()
  set(_probe_dir "${CMAKE_BINARY_DIR}/parquet-probe")
  file(WRITE "${_probe_dir}/probe.cpp" "#include <arrow/api.h>\n#include <parquet/arrow/reader.h>\nint main() { return 0; }\n")
  set(_found "")
  foreach(_std 17 20)
    if(NOT "cxx_std_${_std}" IN_LIST CMAKE_CXX_COMPILE_FEATURES)
      continue()
    endif()
    try_compile(_ok "${_probe_dir}/build-${_std}" SOURCES "${_probe_dir}/probe.cpp"
                CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${pyarrow_dir}/include"
                CXX_STANDARD ${_std} CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                OUTPUT_VARIABLE _log)
    if(_ok)
      set(_found ${_std})
      break()
    endif()
  endforeach()
  set(${_key} "${_found}" CACHE INTERNAL "C++ standard pyarrow's headers compile with (empty: none)")
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()

function(dstrain_add_parquet_plugin pyarrow_dir source_dir output_dir)
  set(DSTRAIN_PARQUET_PLUGIN OFF PARENT_SCOPE)
  _dstrain_parquet_configure_depends("${pyarrow_dir}")
  file(GLOB _arrow_lib "${pyarrow_dir}/libarrow.so.[0-9]*")
  file(GLOB _parquet_lib "${pyarrow_dir}/libparquet.so.[0-9]*")
  list(FILTER _arrow_lib EXCLUDE REGEX "\\.so\\.[0-9]+\\.")
  list(FILTER _parquet_lib EXCLUDE REGEX "\\.so\\.[0-9]+\\.")
  list(LENGTH _arrow_lib _arrow_count)
  list(LENGTH _parquet_lib _parquet_count)
  if(NOT _arrow_count EQUAL 1 OR NOT _parquet_count EQUAL 1 OR NOT EXISTS "${pyarrow_dir}/include/parquet/arrow/reader.h"
     OR NOT EXISTS "${pyarrow_dir}/include/arrow/util/config.h")
    message(STATUS "dstrain: no usable pyarrow wheel at ${pyarrow_dir} (one libarrow.so.N, one libparquet.so.N and the headers): "
                   "Parquet input is not built (scripts/setup.sh installs it)")
    return()
  endif()
  _dstrain_parquet_standard("${pyarrow_dir}" _std)
  if(_std STREQUAL "")
    message(STATUS "dstrain: the Arrow headers of ${pyarrow_dir} compile with neither C++17 nor C++20 here: Parquet input is not "
                   "built (install a pyarrow whose headers this compiler takes, e.g. pip install 'pyarrow<22')")
    return()
  endif()
  add_library(dstrain_parquet MODULE "${source_dir}/dstrain/data/parquet_plugin.cpp")
  target_include_directories(dstrain_parquet PRIVATE "${source_dir}")
  target_include_directories(dstrain_parquet SYSTEM PRIVATE "${pyarrow_dir}/include")
  target_link_libraries(dstrain_parquet PRIVATE ${_parquet_lib} ${_arrow_lib})
  # Its own standard: the plugin's interface is C (parquet_plugin_api.h), so it may differ from dstrain's.
  set_target_properties(dstrain_parquet PROPERTIES CXX_STANDARD ${_std} CXX_STANDARD_REQUIRED ON LIBRARY_OUTPUT_DIRECTORY "${output_dir}"
                                                   BUILD_RPATH "${pyarrow_dir}" INSTALL_RPATH "${pyarrow_dir}")
  message(STATUS "dstrain: Parquet input through ${_arrow_lib} (C++${_std})")
  set(DSTRAIN_PARQUET_PLUGIN ON PARENT_SCOPE)
endfunction()
