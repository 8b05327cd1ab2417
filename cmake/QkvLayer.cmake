# qkv_layer(): one layer of the library (docs/architecture.md) as a static library
# whose code sees only its own headers and those of the layers below it.
#
# All public headers live in include/qkv/ and all private ones under src/, so include
# directories alone cannot tell the layers apart. Each layer therefore gets its own
# include tree in the build directory, made of symbolic links to exactly the headers
# its lists name:
#   build/.../layers/<name>/public/qkv/...   its PUBLIC_HEADERS (paths under include/)
#   build/.../layers/<name>/private/...      its PRIVATE_HEADERS (paths under src/)
# The layer compiles with its own two trees plus the trees of the layers it DEPENDS on
# (transitively), so `#include "qkv/nn/mha.h"` in a tensor source is "No such file";
# ctest layering.up_include proves it. Users of a layer get its public tree (and those
# of the layers below) through the target's interface; the installed package gets
# include/ instead. Links, not copies: an edited header is seen without reconfiguring.
#
#   qkv_layer(<name> EXPORT_NAME <n> SOURCES <src/...> PRIVATE_HEADERS <src/...>
#             PUBLIC_HEADERS <include/...> DEPENDS <layer targets>)
# SOURCES and PRIVATE_HEADERS are relative to src/, PUBLIC_HEADERS to include/.
# Adding a header means adding it to its layer's list (a missing one is "No such file").
function(qkv_layer name)
  cmake_parse_arguments(L "" "EXPORT_NAME" "SOURCES;PRIVATE_HEADERS;PUBLIC_HEADERS;DEPENDS" ${ARGN})
  set(farm ${CMAKE_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${farm})  # links of headers that left the list
  foreach(h IN LISTS L_PUBLIC_HEADERS)
    _qkv_link_header(${PROJECT_SOURCE_DIR}/include/${h} ${farm}/public/${h})
  endforeach()
  foreach(h IN LISTS L_PRIVATE_HEADERS)
    _qkv_link_header(${PROJECT_SOURCE_DIR}/src/${h} ${farm}/private/${h})
  endforeach()
  file(MAKE_DIRECTORY ${farm}/public ${farm}/private)

  list(TRANSFORM L_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/src/)
  add_library(${name} STATIC ${L_SOURCES})
  add_library(qkv::${L_EXPORT_NAME} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${L_EXPORT_NAME})

  # The private trees of this layer and every layer below (internal headers flow down).
  set(private_dirs ${farm}/private)
  foreach(dep IN LISTS L_DEPENDS)
    get_target_property(dep_dirs ${dep} QKV_PRIVATE_INCLUDE_DIRS)
    list(APPEND private_dirs ${dep_dirs})
  endforeach()
  list(REMOVE_DUPLICATES private_dirs)
  set_target_properties(${name} PROPERTIES QKV_PRIVATE_INCLUDE_DIRS "${private_dirs}")

  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${farm}/public> $<INSTALL_INTERFACE:include>
                             PRIVATE ${private_dirs})
  target_link_libraries(${name} PUBLIC ${L_DEPENDS} PRIVATE $<BUILD_INTERFACE:qkv_warnings>)
  target_compile_features(${name} PUBLIC cxx_std_20)  # the headers need C++20 (std::span), users too

  # The package: this layer's headers, at their place under include/.
  foreach(h IN LISTS L_PUBLIC_HEADERS)
    get_filename_component(dir ${h} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/include/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY QKV_LAYERS ${name})
  set_property(GLOBAL APPEND PROPERTY QKV_PUBLIC_HEADERS ${L_PUBLIC_HEADERS})
endfunction()

# After the last layer: every header under include/qkv/ must belong to one, else code
# that includes it would fail with "No such file" far from the cause.
function(qkv_check_public_headers)
  file(GLOB_RECURSE on_disk RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/qkv/*.h)
  get_property(listed GLOBAL PROPERTY QKV_PUBLIC_HEADERS)
  list(REMOVE_ITEM on_disk ${listed})
  if(on_disk)
    message(FATAL_ERROR "public headers in no layer: ${on_disk}; add each to PUBLIC_HEADERS of its "
                        "layer in src/CMakeLists.txt (docs/architecture.md)")
  endif()
endfunction()

function(_qkv_link_header from to)
  if(NOT EXISTS ${from})
    message(FATAL_ERROR "qkv_layer: ${from} is listed but does not exist")
  endif()
  get_filename_component(dir ${to} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  file(CREATE_LINK ${from} ${to} SYMBOLIC)
endfunction()
