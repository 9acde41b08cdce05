# Finds NCCL and reads its version. The NCCL team needs the symmetric-window device
# API of NCCL >= 2.28.9 (2.28.3 fails ncclDevCommCreate on one GPU); below that, or
# without NCCL, everything else still builds and the NCCL team reports why it is
# unavailable. NCCL_ROOT (variable or environment) points at an install prefix
# (e.g. the Python wheel's site-packages/nvidia/nccl).
set(TPDECODE_NCCL_MIN_VERSION 22809)
# Why: find_path/find_library keep what an earlier configure found; a new NCCL_ROOT
# (a rebuild against another NCCL, e.g. pip's persistent build folder) searches again.
set(_nccl_root_now "${NCCL_ROOT}|$ENV{NCCL_ROOT}")
if(NOT _nccl_root_now STREQUAL "${TPDECODE_NCCL_ROOT_SEARCHED}")
  unset(NCCL_INCLUDE_DIR CACHE)
  unset(NCCL_LIBRARY CACHE)
  set(TPDECODE_NCCL_ROOT_SEARCHED "${_nccl_root_now}" CACHE INTERNAL "the NCCL_ROOT of the last NCCL search")
endif()
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
find_path(NCCL_INCLUDE_DIR nccl.h)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2)

set(TPDECODE_NCCL_VERSION 0)
set(TPDECODE_HAVE_NCCL_TEAM OFF)
set(TPDECODE_NCCL_REASON "NCCL not found (set NCCL_ROOT)")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
  string(REGEX REPLACE "^#define NCCL_VERSION_CODE ([0-9]+).*" "\\1" TPDECODE_NCCL_VERSION "${_code}")
  if(TPDECODE_NCCL_VERSION GREATER_EQUAL TPDECODE_NCCL_MIN_VERSION AND EXISTS "${NCCL_INCLUDE_DIR}/nccl_device.h")
    set(TPDECODE_HAVE_NCCL_TEAM ON)
    set(TPDECODE_NCCL_REASON "")
  else()
    set(TPDECODE_NCCL_REASON "NCCL ${TPDECODE_NCCL_VERSION} at ${NCCL_INCLUDE_DIR} is older than 2.28.9 (no symmetric-window device API)")
  endif()
endif()
message(STATUS "NCCL: include=${NCCL_INCLUDE_DIR} library=${NCCL_LIBRARY} version=${TPDECODE_NCCL_VERSION} team=${TPDECODE_HAVE_NCCL_TEAM} ${TPDECODE_NCCL_REASON}")
