# Locates NVSHMEM and defines the imported targets epkit::nvshmem_host and epkit::nvshmem_device.
# Candidates, in order: 1. NVSHMEM_HOME (CMake or env), 2. the nvidia.nvshmem package of the python3
# on PATH, 3. the project-local install made by scripts/setup-deps.sh (.deps/nvshmem). The first
# candidate of the pinned release (cmake/pins.cmake) wins: the device half (headers,
# libnvshmem_device.a, linked into libepkit_comm.so) and the host half it meets at run time
# (libnvshmem_host.so.3) must be one release, or NVSHMEM's device state is corrupted.
include(${CMAKE_CURRENT_LIST_DIR}/DepCandidates.cmake)
epkit_dep_candidates(_nvshmem_candidates NVSHMEM_HOME nvidia.nvshmem)
list(APPEND _nvshmem_candidates "${PROJECT_SOURCE_DIR}/.deps/nvshmem")

function(_epkit_nvshmem_version root out)
  file(STRINGS "${root}/include/non_abi/nvshmem_version.h" _lines REGEX "#define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*NVSHMEM_VENDOR_${_part}_VERSION ([0-9]+).*" "\\1" _v_${_part} "${_lines}")
  endforeach()
  set(${out} "${_v_MAJOR}.${_v_MINOR}.${_v_PATCH}" PARENT_SCOPE)
endfunction()

set(NVSHMEM_ROOT "")
set(_nvshmem_seen "")
foreach(_c IN LISTS _nvshmem_candidates)
  if(EXISTS "${_c}/include/non_abi/nvshmem_version.h" AND EXISTS "${_c}/lib/libnvshmem_device.a")
    _epkit_nvshmem_version("${_c}" _v)
    list(APPEND _nvshmem_seen "${_c} (${_v})")
    if(_v VERSION_EQUAL EPKIT_PIN_NVSHMEM OR (EPKIT_ALLOW_NVSHMEM_VERSION AND NOT NVSHMEM_ROOT))
      set(NVSHMEM_ROOT "${_c}")
      set(EPKIT_NVSHMEM_VERSION "${_v}")
      if(_v VERSION_EQUAL EPKIT_PIN_NVSHMEM)
        break()
      endif()
    endif()
  endif()
endforeach()
if(NOT NVSHMEM_ROOT)
  message(FATAL_ERROR "NVSHMEM ${EPKIT_PIN_NVSHMEM} (the pin, cmake/pins.cmake) not found; found: "
                      "${_nvshmem_seen}; tried: ${_nvshmem_candidates}. Run `make deps` to install the pin, "
                      "or configure with -DEPKIT_ALLOW_NVSHMEM_VERSION=ON to build against another release.")
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
