# Google Highway (SIMD with run-time dispatch), built here as a static library, hwy::hwy.
#
# Version 1.2.0, the one Debian 13 ships, from Debian's archive (the upstream release tarball,
# byte for byte google/highway's tag 1.2.0; pinned by its SHA-256), not Debian 12's libhwy-dev
# 1.0.3: on CPUs with AVX-512 VNNI, 1.0.3's ReorderWidenMulAccumulate on int16 is vpmaddwd and
# a vpaddd on every target, where 1.2.0's AVX3_DL target (Ice Lake server, Sapphire Rapids, Zen 4
# and later; the target list: src/kernels/cpu/hwy_targets.h) issues vpdpwssd, one instruction: the
# int8 decode kernels' multiply-adds (docs/decode_int8.md, "Highway 1.2"). Offline: -DFETCHCONTENT_SOURCE_DIR_HWY=<an unpacked highway-1.2.0> (or
# FETCHCONTENT_FULLY_DISCONNECTED=ON once build/_deps holds it).
include(FetchContent)
set(QKV_HWY_URL "https://deb.debian.org/debian/pool/main/h/highway/highway_1.2.0.orig.tar.gz"
    CACHE STRING "Highway 1.2.0's source tarball")
FetchContent_Declare(hwy URL ${QKV_HWY_URL}
                     URL_HASH SHA256=7e0be78b8318e8bdbf6fa545d2ecb4c90f947df03f7aadc42c1967f019e63343)
FetchContent_GetProperties(hwy)
if(NOT hwy_POPULATED)
  FetchContent_Populate(hwy)
  # The library only: no tests, examples, contrib or install rules of its own (QkvPackage.cmake
  # installs it with qkv's libraries), static, position-independent (the Python module links it).
  set(HWY_ENABLE_TESTS OFF CACHE BOOL "" FORCE)
  set(HWY_ENABLE_EXAMPLES OFF CACHE BOOL "" FORCE)
  set(HWY_ENABLE_CONTRIB OFF CACHE BOOL "" FORCE)
  set(HWY_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
  set(HWY_FORCE_STATIC_LIBS ON CACHE BOOL "" FORCE)
  # SYSTEM: its headers are included as system headers, so qkv's warning flags (-Werror in CI)
  # apply to qkv's code only; EXCLUDE_FROM_ALL: its tools (hwy_list_targets) are not built.
  add_subdirectory(${hwy_SOURCE_DIR} ${hwy_BINARY_DIR} EXCLUDE_FROM_ALL SYSTEM)
endif()
if(NOT TARGET hwy::hwy)
  add_library(hwy::hwy ALIAS hwy)
endif()
