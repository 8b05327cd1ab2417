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

expect_success(demo demo)
string(FIND "${LAST_OUT}" "attention weights" at)
if(at EQUAL -1)
  message(FATAL_ERROR "demo output lacks the attention weights:\n${LAST_OUT}")
endif()

expect_failure(missing_file 1 "missing.npy" attention --q ${WORK}/missing.npy --k ${WORK}/missing.npy
               --v ${WORK}/missing.npy -o ${WORK}/out.npy)
file(WRITE ${WORK}/garbage.npy "this is not a npy file")
expect_failure(garbage_npy 1 "garbage.npy" inspect ${WORK}/garbage.npy)
expect_failure(no_subcommand 2 "qkv: usage error: A subcommand is required")
expect_failure(unknown_subcommand 2 "qkv: usage error: 'bogus' is not a subcommand of qkv" bogus)
expect_failure(bad_threads 2 "--threads: expected an integer in [1, 4096], got '0'" bench attention --threads 0)

expect_success(version --version)
if(NOT LAST_OUT MATCHES "^qkv [0-9]+\\.[0-9]+\\.[0-9]+\n$")
  message(FATAL_ERROR "qkv --version printed '${LAST_OUT}'")
endif()
