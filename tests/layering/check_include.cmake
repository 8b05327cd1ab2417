# ctest layering.*: compiles probe.cc with the include directories of one layer's
# target (INCLUDES, from $<TARGET_PROPERTY:...,INCLUDE_DIRECTORIES>) and HEADER as its
# one include. EXPECT=ok: it compiles. EXPECT=missing: the compiler stops because
# HEADER is not found (not for any other reason), i.e. a layer cannot see it.
foreach(v CXX PROBE INCLUDES HEADER EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_include.cmake: -D${v}= missing")
  endif()
endforeach()
set(flags -std=c++20 -fsyntax-only "-DQKV_PROBE_HEADER=\"${HEADER}\"")
foreach(dir IN LISTS INCLUDES)
  if(dir)  # the genex leaves empty entries
    list(APPEND flags -I${dir})
  endif()
endforeach()
execute_process(COMMAND ${CXX} ${flags} ${PROBE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(EXPECT STREQUAL "ok")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${HEADER} should compile in this layer's include context but:\n${out}")
  endif()
elseif(EXPECT STREQUAL "missing")
  string(REGEX REPLACE "([.+])" "\\\\\\1" header_re "${HEADER}")
  if(rc EQUAL 0 OR NOT out MATCHES "${header_re}: No such file or directory")
    message(FATAL_ERROR "${HEADER} should be out of reach of this layer (\"No such file\"), got rc=${rc}:\n${out}")
  endif()
else()
  message(FATAL_ERROR "check_include.cmake: EXPECT must be ok or missing")
endif()
message(STATUS "${HEADER}: ${EXPECT} as expected")
