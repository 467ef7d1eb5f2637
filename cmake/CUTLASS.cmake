# Locates the CUTLASS headers (the grouped GEMM of src/moe/ is built on them) and defines the
# interface target epkit::cutlass. Search order: 1. CUTLASS_HOME (CMake or env; a CUTLASS source
# tree or the `source` folder of the nvidia-cutlass wheel), 2. the cutlass_library package of the
# python3 on PATH (the pinned wheel, e.g. in pip's build environment), 3. the pinned install made by
# scripts/setup-deps.sh (.deps/cutlass). Headers only: nothing is linked.
if(TARGET epkit::cutlass)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/DepCandidates.cmake)
epkit_dep_candidates(_cutlass_found CUTLASS_HOME cutlass_library)
# The nvidia-cutlass wheel keeps the headers under cutlass_library/source.
set(_cutlass_candidates "")
foreach(_c IN LISTS _cutlass_found)
  list(APPEND _cutlass_candidates "${_c}" "${_c}/source")
endforeach()
list(APPEND _cutlass_candidates "${PROJECT_SOURCE_DIR}/.deps/cutlass")
set(EPKIT_CUTLASS_ROOT "")
foreach(_c IN LISTS _cutlass_candidates)
  if(EXISTS "${_c}/include/cutlass/cutlass.h" AND EXISTS "${_c}/include/cute/tensor.hpp")
    set(EPKIT_CUTLASS_ROOT "${_c}")
    break()
  endif()
endforeach()
if(NOT EPKIT_CUTLASS_ROOT)
  message(FATAL_ERROR "CUTLASS headers not found (tried: ${_cutlass_candidates}). Run `make deps` or set CUTLASS_HOME.")
endif()
file(STRINGS "${EPKIT_CUTLASS_ROOT}/include/cutlass/version.h" _cutlass_ver REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
message(STATUS "CUTLASS: ${EPKIT_CUTLASS_ROOT} (${_cutlass_ver})")
add_library(epkit::cutlass INTERFACE IMPORTED GLOBAL)
set(_cutlass_inc "${EPKIT_CUTLASS_ROOT}/include")
if(EXISTS "${EPKIT_CUTLASS_ROOT}/tools/util/include")
  list(APPEND _cutlass_inc "${EPKIT_CUTLASS_ROOT}/tools/util/include")
endif()
# SYSTEM: CUTLASS's own warnings are not ours to fix.
set_target_properties(epkit::cutlass PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_cutlass_inc}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${_cutlass_inc}")
