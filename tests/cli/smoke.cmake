# End-to-end checks of the qkv tool's exit codes and messages (run by ctest as cli.smoke).
# -DQKV=<path to qkv> -DWORK=<scratch dir>
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

# Exit codes: 1 runtime error, 2 usage error (README "Command line").
function(expect_failure name expected_rc expected_text)
  execute_process(COMMAND ${QKV} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "${name}: expected exit ${expected_rc}, got ${rc}\n${out}\n${err}")
  endif()
  string(FIND "${err}" "${expected_text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${name}: stderr lacks '${expected_text}':\n${err}")
  endif()
endfunction()

function(expect_success name)
  execute_process(COMMAND ${QKV} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: exit ${rc}\n${err}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()

# `text` as a list of its lines, with [ ] read as < > (a CMake list does not
# split inside square brackets) and ; as , (the separator); empty lines kept.
cmake_policy(SET CMP0007 NEW)
function(lines_of text out_var)
  string(REPLACE "[" "<" t "${text}")
  string(REPLACE "]" ">" t "${t}")
  string(REPLACE ";" "," t "${t}")
  string(REPLACE "\n" ";" t "${t}")
  set(${out_var} "${t}" PARENT_SCOPE)
endfunction()

# Index of the whole line `line` (with < > for [ ]) in the list `lines`; fails if absent.
function(find_line name lines line out_var)
  list(FIND lines "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${name}: no line '${line}' in:\n${LAST_OUT}")
  endif()
  set(${out_var} ${at} PARENT_SCOPE)
endfunction()

# demo: whole lines, checked against what is known without qkv: the inputs; the
# causal weights, whose query-0 rows are exactly [1, 0] and whose query-1 rows
# equal the unmasked ones (Lq == Lk); the trained model's outputs against the
# outputs Keras recorded (tests/fixtures/seed001), within 1e-5.
expect_success(demo demo)
lines_of("${LAST_OUT}" demo)
find_line(demo "${demo}" "inputs x <2, 2, 3>:" at)
foreach(want "array(<<<1., 2., 3.>," "        <4., 5., 6.>>," "" "       <<1., 1., 1.>,"
             "        <2., 2., 6.>>>, dtype=float32)")
  math(EXPR at "${at} + 1")
  list(GET demo ${at} got)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "demo: inputs line '${got}', expected '${want}'\n${LAST_OUT}")
  endif()
endforeach()
find_line(demo "${demo}" "attention weights softmax(q k^T / sqrt(4)) <batch, heads, query, key> <2, 2, 2, 2>:" full)
find_line(demo "${demo}" "causal attention weights (token 0 sees only itself) <2, 2, 2, 2>:" causal)
set(first_rows 0)
foreach(offset RANGE 1 12)  # the 12 lines of a [2, 2, 2, 2] array
  math(EXPR f "${full} + ${offset}")
  math(EXPR c "${causal} + ${offset}")
  list(GET demo ${f} full_line)
  list(GET demo ${c} causal_line)
  if(causal_line MATCHES "^ *(array\\()?<*1\\.        , 0\\.        >,$")
    math(EXPR first_rows "${first_rows} + 1")
  elseif(NOT causal_line STREQUAL full_line)
    message(FATAL_ERROR "demo: causal line '${causal_line}' is neither [1, 0] nor the unmasked '${full_line}'")
  endif()
endforeach()
if(NOT first_rows EQUAL 4)
  message(FATAL_ERROR "demo: ${first_rows} causal query-0 rows are [1, 0], expected 4\n${LAST_OUT}")
endif()
foreach(row "0.1 -0.10707488" "1 -1.8418952" "10 -19.190096" "100 -192.67209" "1000 -1927.4922")
  separate_arguments(row)
  list(GET row 0 c)
  list(GET row 1 keras)
  string(REPLACE "." "\\." c "${c}")
  string(REPLACE "." "\\." keras "${keras}")
  set(hit "${demo}")
  # An error below 1e-5 (e-06 ...), or exactly 0 (0.00e+00: seen on an AVX-512 EPYC for c = 1).
  list(FILTER hit INCLUDE REGEX "^ +${c} +-[0-9.]+ +${keras} +([0-9.]+e-(0[6-9]|[1-9][0-9])|0\\.00e\\+00)$")
  list(LENGTH hit n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "demo: no line for c = ${c} with Keras ${keras} and an error below 1e-5:\n${LAST_OUT}")
  endif()
endforeach()

# The whole first line of stderr.
function(expect_error_line name expected_rc line)
  execute_process(COMMAND ${QKV} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  string(REGEX REPLACE "\n.*" "" first "${err}")
  if(NOT rc EQUAL expected_rc OR NOT first STREQUAL line)
    message(FATAL_ERROR "${name}: exit ${rc}, stderr '${first}'; expected exit ${expected_rc}, '${line}'")
  endif()
endfunction()

expect_error_line(missing_file 1 "qkv: error: load: ${WORK}/missing.npy: cannot open for reading: no such file"
                  attention --q ${WORK}/missing.npy --k ${WORK}/missing.npy --v ${WORK}/missing.npy -o ${WORK}/out.npy)
file(WRITE ${WORK}/garbage.npy "this is not a npy file")
expect_error_line(garbage_npy 1
                  "qkv: error: inspect: ${WORK}/garbage.npy: not an .npy file: bad magic string (starts with 74 68 69 73 20 69 73 20)"
                  inspect ${WORK}/garbage.npy)
expect_failure(no_subcommand 2 "qkv: usage error: A subcommand is required")
expect_failure(unknown_subcommand 2 "qkv: usage error: 'bogus' is not a subcommand of qkv" bogus)
expect_failure(bad_threads 2 "--threads: expected an integer in [1, 4096], got '0'" bench attention --threads 0)

expect_success(version --version)
if(NOT LAST_OUT MATCHES "^qkv [0-9]+\\.[0-9]+\\.[0-9]+\n$")
  message(FATAL_ERROR "qkv --version printed '${LAST_OUT}'")
endif()

# info: one machine line (qkv/machine.h) naming the Highway target and oneDNN's ISA; --json one object.
expect_success(info info)
if(NOT LAST_OUT MATCHES "^[^\n]+, [0-9]+ vCPUs, [0-9]+ threads?; flags: [^\n]+; Highway: [A-Z0-9_]+; oneDNN isa: [^\n]+\n$")
  message(FATAL_ERROR "qkv info printed '${LAST_OUT}'")
endif()
expect_success(info_json info --json)
string(JSON isa ERROR_VARIABLE json_error GET "${LAST_OUT}" onednn_isa)
if(json_error OR isa STREQUAL "")
  message(FATAL_ERROR "qkv info --json: no onednn_isa in '${LAST_OUT}' (${json_error})")
endif()
expect_failure(info_bad_option 2 "The following argument was not expected: --bogus" info --bogus)
