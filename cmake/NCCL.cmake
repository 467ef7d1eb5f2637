# Locates NCCL for epkit-bench's dense baseline and defines epkit::nccl plus EPKIT_HAVE_NCCL.
# Search order: 1. NCCL_HOME (CMake or env), 2. the nvidia.nccl package of the python3 on PATH (how
# torch ships it: lib/libnccl.so.2, include/nccl.h), 3. the CUDA toolkit. Not found is not fatal:
# epkit-bench is then built without the NCCL baseline and says so when it runs.
if(TARGET epkit::nccl)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/DepCandidates.cmake)
epkit_dep_candidates(_nccl_candidates NCCL_HOME nvidia.nccl)
if(CUDAToolkit_INCLUDE_DIRS)
  list(GET CUDAToolkit_INCLUDE_DIRS 0 _nccl_cuda_inc)
  get_filename_component(_nccl_cuda_root "${_nccl_cuda_inc}" DIRECTORY)
  list(APPEND _nccl_candidates "${_nccl_cuda_root}")
endif()

set(EPKIT_HAVE_NCCL OFF)
foreach(_c IN LISTS _nccl_candidates)
  if(NOT EXISTS "${_c}/include/nccl.h")
    continue()
  endif()
  set(_nccl_lib "")
  foreach(_dir lib lib64 "lib/x86_64-linux-gnu")
    foreach(_name libnccl.so.2 libnccl.so)
      if(NOT _nccl_lib AND EXISTS "${_c}/${_dir}/${_name}")
        set(_nccl_lib "${_c}/${_dir}/${_name}")
      endif()
    endforeach()
  endforeach()
  if(_nccl_lib)
    set(EPKIT_HAVE_NCCL ON)
    set(EPKIT_NCCL_ROOT "${_c}")
    break()
  endif()
endforeach()

if(EPKIT_HAVE_NCCL)
  message(STATUS "NCCL: ${_nccl_lib}")
  get_filename_component(EPKIT_NCCL_LIBDIR "${_nccl_lib}" DIRECTORY)
  add_library(epkit::nccl SHARED IMPORTED GLOBAL)
  set_target_properties(epkit::nccl PROPERTIES
    IMPORTED_LOCATION "${_nccl_lib}"
    IMPORTED_SONAME "libnccl.so.2"
    INTERFACE_INCLUDE_DIRECTORIES "${EPKIT_NCCL_ROOT}/include")
else()
  message(STATUS "NCCL: not found (tried: ${_nccl_candidates}); epkit-bench is built without the NCCL baseline")
endif()
