# Locates NVSHMEM and defines the imported targets epkit::nvshmem_host and epkit::nvshmem_device.
# Search order (issue #2): 1. NVSHMEM_HOME (CMake or env), 2. the nvidia.nvshmem package of the
# python3 on PATH, 3. the project-local install made by scripts/setup-deps.sh (.deps/nvshmem).
include(${CMAKE_CURRENT_LIST_DIR}/DepCandidates.cmake)
epkit_dep_candidates(_nvshmem_candidates NVSHMEM_HOME nvidia.nvshmem)
list(APPEND _nvshmem_candidates "${PROJECT_SOURCE_DIR}/.deps/nvshmem")

set(NVSHMEM_ROOT "")
foreach(_c IN LISTS _nvshmem_candidates)
  if(EXISTS "${_c}/include/nvshmem.h" AND EXISTS "${_c}/lib/libnvshmem_device.a")
    set(NVSHMEM_ROOT "${_c}")
    break()
  endif()
endforeach()
if(NOT NVSHMEM_ROOT)
  message(FATAL_ERROR "NVSHMEM not found (tried: ${_nvshmem_candidates}). Run `make deps` or set NVSHMEM_HOME.")
endif()

find_library(_nvshmem_host NAMES libnvshmem_host.so.3 nvshmem_host PATHS "${NVSHMEM_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
message(STATUS "NVSHMEM: ${NVSHMEM_ROOT}")

add_library(epkit::nvshmem_host SHARED IMPORTED GLOBAL)
set_target_properties(epkit::nvshmem_host PROPERTIES
  IMPORTED_LOCATION "${_nvshmem_host}"
  IMPORTED_SONAME "libnvshmem_host.so.3"
  INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_ROOT}/include")
add_library(epkit::nvshmem_device STATIC IMPORTED GLOBAL)
set_target_properties(epkit::nvshmem_device PROPERTIES
  IMPORTED_LOCATION "${NVSHMEM_ROOT}/lib/libnvshmem_device.a"
  INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_ROOT}/include")
set(EPKIT_NVSHMEM_LIBDIR "${NVSHMEM_ROOT}/lib")
