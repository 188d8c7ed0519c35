# Runs train_lm on its embedded default for a few steps and checks what a user would look at: the run ends,
# the loss fell, and the run directory holds the resolved config, the metrics and the summary.
# Inputs: TRAIN_LM (the program), WORK_DIR (scratch), STEPS.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(
  COMMAND ${TRAIN_LM} --trainer.num_train_steps ${STEPS} --trainer.id ci --trainer.log_dir ${WORK_DIR}/logs
          --trainer.steps_per_eval 10
  WORKING_DIRECTORY ${WORK_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_lm exited with ${rc}")
endif()
set(run ${WORK_DIR}/logs/ci)
foreach(f config.yaml metrics.jsonl summary.json train_lm.log)
  if(NOT EXISTS ${run}/${f})
    message(FATAL_ERROR "the run directory lacks ${f}")
  endif()
endforeach()
file(READ ${run}/summary.json summary)
string(JSON steps GET "${summary}" steps)
string(JSON first GET "${summary}" first_loss)
string(JSON final GET "${summary}" final_loss)
string(JSON eval GET "${summary}" eval_loss)
if(NOT steps EQUAL ${STEPS})
  message(FATAL_ERROR "summary says ${steps} steps, expected ${STEPS}")
endif()
# if(GREATER_EQUAL) compares numbers as doubles.
if(final GREATER_EQUAL first)
  message(FATAL_ERROR "the loss did not fall: ${first} -> ${final}")
endif()
file(STRINGS ${run}/metrics.jsonl lines)
list(LENGTH lines n)
if(n LESS ${STEPS})
  message(FATAL_ERROR "metrics.jsonl has ${n} lines for ${STEPS} steps")
endif()
file(READ ${run}/config.yaml resolved)
if(NOT resolved MATCHES "num_train_steps: ${STEPS}")
  message(FATAL_ERROR "config.yaml does not hold the resolved num_train_steps")
endif()
message("train_lm e2e: ${steps} steps, loss ${first} -> ${final}, eval ${eval}")
