# Installs the just-built hisparse into a fresh prefix, checks what the
# install contains, then configures, builds and runs examples/cpp against
# that prefix through find_package(hisparse), as a downstream project would.
#
# cmake -DHISPARSE_BUILD_DIR=... -DEXAMPLE_SOURCE_DIR=... -DWORK_DIR=...
#       [-DGENERATOR=...] [-DCXX_COMPILER=...] [-DBUILD_TYPE=...] -P consumer_example.cmake

foreach(_var HISPARSE_BUILD_DIR EXAMPLE_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "consumer_example.cmake: pass -D${_var}=...")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(_prefix "${WORK_DIR}/prefix")
set(_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _result OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  message("${_out}")
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "consumer example: ${what} failed (${_result})")
  endif()
endfunction()

run_step("cmake --install" "${CMAKE_COMMAND}" --install "${HISPARSE_BUILD_DIR}" --prefix "${_prefix}"
         --config "${BUILD_TYPE}" --component cpp)

# The install must hold the headers, the shared library with its soname
# links, and the package files find_package() reads.
foreach(_header hisparse.h hisparse.hpp)
  if(NOT EXISTS "${_prefix}/include/hisparse/${_header}")
    message(FATAL_ERROR "install is missing include/hisparse/${_header}")
  endif()
endforeach()
file(GLOB _config "${_prefix}/lib*/cmake/hisparse/hisparseConfig.cmake")
if(NOT _config)
  message(FATAL_ERROR "install is missing lib/cmake/hisparse/hisparseConfig.cmake")
endif()
get_filename_component(_cmake_dir "${_config}" DIRECTORY)
get_filename_component(_libdir "${_cmake_dir}/../.." ABSOLUTE)
foreach(_file hisparseConfigVersion.cmake hisparseTargets.cmake)
  if(NOT EXISTS "${_cmake_dir}/${_file}")
    message(FATAL_ERROR "install is missing ${_cmake_dir}/${_file}")
  endif()
endforeach()
file(GLOB _targets_per_config "${_cmake_dir}/hisparseTargets-*.cmake")
if(NOT _targets_per_config)
  message(FATAL_ERROR "install is missing ${_cmake_dir}/hisparseTargets-<config>.cmake")
endif()
file(GLOB _libraries "${_libdir}/libhisparse.so*")
list(LENGTH _libraries _library_count)
if(_library_count LESS 3)
  message(FATAL_ERROR "expected libhisparse.so, libhisparse.so.<major> and libhisparse.so.<version> in "
                      "${_libdir}, found: ${_libraries}")
endif()

set(_configure "${CMAKE_COMMAND}" -S "${EXAMPLE_SOURCE_DIR}" -B "${_build}"
    "-DCMAKE_PREFIX_PATH=${_prefix}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
if(GENERATOR)
  list(APPEND _configure -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND _configure "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run_step("configuring the example" ${_configure})
run_step("building the example" "${CMAKE_COMMAND}" --build "${_build}" --config "${BUILD_TYPE}")

find_program(_example hisparse_consumer PATHS "${_build}" "${_build}/${BUILD_TYPE}" NO_DEFAULT_PATH)
if(NOT _example)
  message(FATAL_ERROR "the example built no hisparse_consumer executable in ${_build}")
endif()
execute_process(COMMAND "${_example}" RESULT_VARIABLE _result OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _result EQUAL 0 OR NOT _out MATCHES "consumer example OK")
  message(FATAL_ERROR "the example failed (exit ${_result})")
endif()
# It must have run against the installed library, not the build tree's.
execute_process(COMMAND ldd "${_example}" OUTPUT_VARIABLE _ldd ERROR_QUIET)
if(_ldd)
  string(FIND "${_ldd}" "${_libdir}/libhisparse.so" _found)
  if(_found EQUAL -1)
    message(FATAL_ERROR "the example did not resolve libhisparse from the install prefix:\n${_ldd}")
  endif()
endif()
