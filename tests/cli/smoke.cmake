# End-to-end checks of the qkv tool's exit codes and messages (run by ctest as cli.smoke).
# -DQKV=<path to qkv> -DWORK=<scratch dir>
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(expect_failure name expected_text)
  execute_process(COMMAND ${QKV} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${name}: expected a non-zero exit, got 0\n${out}")
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

expect_failure(missing_file "missing.npy" attention --q ${WORK}/missing.npy --k ${WORK}/missing.npy
               --v ${WORK}/missing.npy -o ${WORK}/out.npy)
file(WRITE ${WORK}/garbage.npy "this is not a npy file")
expect_failure(garbage_npy "garbage.npy" inspect ${WORK}/garbage.npy)
expect_failure(no_subcommand "subcommand")
