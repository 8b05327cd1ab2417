# ctest dist.peer_dies / peer_silent / peer_silent_split / peer_refuses: a two-rank job whose rank 1
# dies, never answers (in ring_attention, or in Communicator::split), or refuses its arguments must end, within the test's time, with a non-zero exit
# and a message saying so (for refuses: rank 0's, naming rank 1 and quoting its error, not a
# timeout: QKV_DIST_TIMEOUT is 5 s here, so a rank 0 left waiting reports "no completion").
#   cmake -DMPIEXEC=... -DPROGRAM=qkv_dist_failure -DMODE=dies|silent|silent_split|refuses -P peer_failure.cmake
set(ENV{QKV_DIST_TIMEOUT} 5)
execute_process(COMMAND ${MPIEXEC} -np 2 ${PROGRAM} ${MODE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 90)
set(all "${out}${err}")
if(rc MATCHES "timeout" OR rc MATCHES "Process terminated due to timeout")
  message(FATAL_ERROR "peer ${MODE}: the job hung (killed after 90 s)\n${all}")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "peer ${MODE}: the job exited 0 although rank 1 failed\n${all}")
endif()
if(MODE MATCHES "^silent")
  set(want "no completion after .* a peer rank died or never posted its side")
elseif(MODE STREQUAL "refuses")
  set(want "rank 0: TensorParallelAttention::from_projections: rank 1 of 2 refused the call, so rank 0 stops too; rank 1 said: TensorParallelAttention: weights q \\[8, 9\\]")
else()
  set(want "(signal 9|Killed|exited on signal)")
endif()
if(NOT all MATCHES "${want}")
  message(FATAL_ERROR "peer ${MODE}: exit ${rc}, but no message matching '${want}':\n${all}")
endif()
message(STATUS "peer ${MODE}: exit ${rc}, the job said so:\n${all}")
