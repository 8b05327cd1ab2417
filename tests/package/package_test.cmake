# ctest package.consumer: the C++ package as a user gets it. Installs BUILD into
# WORK/prefix (`cmake --install`), then builds the consumer of README.md "C++ package"
# (consumer/: find_package(qkv) + qkv::qkv) against that prefix, and the same program
# through pkg-config (qkv.pc), and runs both: SDPA and einsum against float64 loops.
foreach(v BUILD WORK SOURCE CXX GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "package_test.cmake: -D${v}= missing")
  endif()
endforeach()
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
foreach(f include/qkv/attention.h include/qkv/nn/mha.h lib/cmake/qkv/qkvConfig.cmake
          lib/cmake/qkv/qkvConfigVersion.cmake lib/pkgconfig/qkv.pc lib/libqkv_ops.a)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

# CMake: find_package(qkv REQUIRED) + target_link_libraries(app qkv::qkv).
run(${CMAKE_COMMAND} -S ${SOURCE}/consumer -B ${WORK}/consumer -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX} "-DCMAKE_CXX_FLAGS=${FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${FLAGS}")
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/app)
message(STATUS "find_package consumer: ${last_output}")
if(NOT last_output MATCHES "consumer: ok")
  message(FATAL_ERROR "the consumer did not report ok")
endif()

# pkg-config: the same program from `pkg-config --cflags --libs --static qkv`. pkg-config is
# installed by make deps (scripts/install-deps.sh), so its absence is a failure, not a skip.
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config not found: qkv.pc cannot be checked (make deps installs it)")
endif()
set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
run(${PKG_CONFIG} --cflags --libs --static qkv)
string(STRIP "${last_output}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
separate_arguments(extra UNIX_COMMAND "${FLAGS}")
run(${CXX} -std=c++20 ${extra} ${SOURCE}/consumer/main.cc ${pc_flags} -o ${WORK}/app_pkgconfig)
run(${WORK}/app_pkgconfig)
message(STATUS "pkg-config consumer: ${last_output}")
if(NOT last_output MATCHES "consumer: ok")
  message(FATAL_ERROR "the pkg-config consumer did not report ok")
endif()
