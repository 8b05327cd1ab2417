# qkvdeps::cudart (the CUDA runtime, static) and qkvdeps::cublas, from the toolkit whose
# directory is QKV_CUDA_ROOT (set by the build from nvcc's location; the installed
# qkvConfig.cmake records it). Used by the build and by the installed qkvConfig.cmake.
#
# Not find_package(CUDAToolkit): Debian 12's CMake 3.25 fails in FindCUDAToolkit on CUDA
# 13, which no longer ships nvToolsExt ("set_property could not find TARGET
# CUDA::nvToolsExt"); an earlier session had patched the module on its machine by hand,
# and only a fresh root showed it.
if(NOT TARGET qkvdeps::cudart)
  set(_qkv_cuda_lib_dirs ${QKV_CUDA_ROOT}/lib64 ${QKV_CUDA_ROOT}/lib
      ${QKV_CUDA_ROOT}/targets/${CMAKE_SYSTEM_PROCESSOR}-linux/lib)
  find_path(QKV_CUDA_INCLUDE_DIR cuda_runtime_api.h NO_DEFAULT_PATH
            PATHS ${QKV_CUDA_ROOT}/include ${QKV_CUDA_ROOT}/targets/${CMAKE_SYSTEM_PROCESSOR}-linux/include)
  find_library(QKV_CUDART_LIBRARY cudart_static NO_DEFAULT_PATH PATHS ${_qkv_cuda_lib_dirs})
  find_library(QKV_CUBLAS_LIBRARY cublas NO_DEFAULT_PATH PATHS ${_qkv_cuda_lib_dirs})
  if(QKV_CUDA_INCLUDE_DIR AND QKV_CUDART_LIBRARY)
    find_package(Threads REQUIRED)
    add_library(qkvdeps::cudart STATIC IMPORTED)
    set_target_properties(qkvdeps::cudart PROPERTIES IMPORTED_LOCATION ${QKV_CUDART_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${QKV_CUDA_INCLUDE_DIR}
                          INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};rt")
  endif()
  if(QKV_CUDA_INCLUDE_DIR AND QKV_CUBLAS_LIBRARY)
    add_library(qkvdeps::cublas SHARED IMPORTED)
    set_target_properties(qkvdeps::cublas PROPERTIES IMPORTED_LOCATION ${QKV_CUBLAS_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${QKV_CUDA_INCLUDE_DIR})
  endif()
endif()
