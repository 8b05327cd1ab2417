# qkvdeps::openblas: the OpenMP build of OpenBLAS (Debian's libopenblas-openmp-dev), for
# float64 GEMM (oneDNN has no f64 matmul on CPUs); the OpenMP build so that it shares
# qkv's OpenMP threads. Used by the build and by the installed qkvConfig.cmake.
if(NOT TARGET qkvdeps::openblas)
  find_path(QKV_OPENBLAS_INCLUDE_DIR cblas.h NO_DEFAULT_PATH
            PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
  find_library(QKV_OPENBLAS_LIBRARY openblas NO_DEFAULT_PATH
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
  if(QKV_OPENBLAS_INCLUDE_DIR AND QKV_OPENBLAS_LIBRARY)
    add_library(qkvdeps::openblas UNKNOWN IMPORTED)
    set_target_properties(qkvdeps::openblas PROPERTIES IMPORTED_LOCATION ${QKV_OPENBLAS_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${QKV_OPENBLAS_INCLUDE_DIR})
  endif()
endif()
