# The C++ package: `cmake --install <build> --prefix <p>` puts the headers in
# <p>/include/qkv, the layer libraries in <p>/lib, qkvConfig.cmake + version file +
# qkvTargets.cmake in <p>/lib/cmake/qkv and qkv.pc in <p>/lib/pkgconfig. A consumer:
#   find_package(qkv REQUIRED)  target_link_libraries(app qkv::qkv)
# (README.md "C++ package"; ctest package.consumer builds and runs one.) The wheel
# (scikit-build-core) installs only the component "python", so none of this goes into it.
include(CMakePackageConfigHelpers)
set(QKV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)

get_property(QKV_LAYERS GLOBAL PROPERTY QKV_LAYERS)
install(TARGETS ${QKV_LAYERS} qkv hwy EXPORT qkvTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})  # hwy: QkvHighway.cmake
install(EXPORT qkvTargets NAMESPACE qkv:: DESTINATION ${QKV_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/package/qkvConfig.cmake INSTALL_DESTINATION ${QKV_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/qkvConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/qkvConfig.cmake ${PROJECT_BINARY_DIR}/package/qkvConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/QkvOpenBLAS.cmake ${PROJECT_SOURCE_DIR}/cmake/QkvCudaLibs.cmake
        DESTINATION ${QKV_CMAKE_DIR})

# pkg-config, relocatable: the prefix is found from the .pc file's own directory.
file(RELATIVE_PATH QKV_PC_PREFIX_FROM_PCFILEDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
get_target_property(QKV_OPENBLAS_LIBRARY qkvdeps::openblas IMPORTED_LOCATION)
set(QKV_PC_DIST_LIB "")  # qkv::dist and Open MPI's pkg-config module, when built with MPI
set(QKV_PC_DIST_REQUIRES "")
if(QKV_HAVE_MPI)
  set(QKV_PC_DIST_LIB "-lqkv_dist ")
  set(QKV_PC_DIST_REQUIRES " ompi-c")
endif()
set(QKV_PC_CUDA_LIBS "")  # the CUDA runtime (static), when built with the CUDA backend
if(QKV_HAVE_CUDA)
  get_filename_component(_qkv_cudart_dir ${QKV_CUDART_LIBRARY} DIRECTORY)
  set(QKV_PC_CUDA_LIBS " -L${_qkv_cudart_dir} -lcudart_static -ldl -lrt -lpthread")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/package/qkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/qkv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
