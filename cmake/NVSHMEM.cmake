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

# The device half (headers, libnvshmem_device.a) and the host half (libnvshmem_host.so.3) must be the
# release the project pins (cmake/pins.cmake): a device library of another release than the host
# library it meets at run time corrupts NVSHMEM's device state.
file(STRINGS "${NVSHMEM_ROOT}/include/non_abi/nvshmem_version.h" _nv_ver_lines
     REGEX "#define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*NVSHMEM_VENDOR_${_part}_VERSION ([0-9]+).*" "\\1" _v_${_part} "${_nv_ver_lines}")
endforeach()
set(EPKIT_NVSHMEM_VERSION "${_v_MAJOR}.${_v_MINOR}.${_v_PATCH}")
if(NOT EPKIT_NVSHMEM_VERSION VERSION_EQUAL EPKIT_PIN_NVSHMEM AND NOT EPKIT_ALLOW_NVSHMEM_VERSION)
  message(FATAL_ERROR "NVSHMEM ${EPKIT_NVSHMEM_VERSION} found at ${NVSHMEM_ROOT}, but epkit pins ${EPKIT_PIN_NVSHMEM} "
                      "(cmake/pins.cmake). Run `make deps` to install the pin, or configure with "
                      "-DEPKIT_ALLOW_NVSHMEM_VERSION=ON to build against this release anyway.")
endif()
find_library(_nvshmem_host NAMES libnvshmem_host.so.3 nvshmem_host PATHS "${NVSHMEM_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
message(STATUS "NVSHMEM ${EPKIT_NVSHMEM_VERSION}: ${NVSHMEM_ROOT}")

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
