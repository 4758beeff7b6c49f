# The installed binary works on its own (issue 5: "through the installed binary"),
# run by CTest as `cmake -P`:
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -P installed_binary.cmake
# Installs the build into a fresh prefix, then, from a directory outside the source
# tree, runs `list`, a small emulated sweep on the embedded fixtures (exit 0), the
# ring negative control (exit 1), two `run` dumps compared by `diff` (exit 0), a
# bad plan (exit 2), a Hugging Face checkpoint written by transformers (exit 0) and the
# same checkpoint truncated (exit 2, naming the file). The prefix is removed.
cmake_minimum_required(VERSION 3.25...4.4)
include(${CMAKE_CURRENT_LIST_DIR}/script_common.cmake)
bp_require(installed_binary BUILD_DIR SOURCE_DIR WORK_DIR)
bp_scratch_dir(prefix "${WORK_DIR}" installed)
file(MAKE_DIRECTORY "${prefix}/cwd")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}"
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${prefix}/bin/bitparity")
  message(FATAL_ERROR "install into ${prefix} failed (${rc}): ${err}")
endif()

# expect(<exit code> <args...>): run the installed binary in the scratch directory.
function(expect code)
  execute_process(COMMAND "${prefix}/bin/bitparity" ${ARGN} WORKING_DIRECTORY "${prefix}/cwd"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "${code}")
    message(FATAL_ERROR "bitparity ${ARGN}: exit ${rc}, expected ${code}\n${out}\n${err}")
  endif()
endfunction()

expect(0 list)
expect(0 sweep --quiet --model qwen3-moe-tiny --contract bf16-fmaseq-v1 --implementation emulated
       --layout tp2-ep2-cp2z --path decode --lengths 5,9 --json report.json)
expect(1 sweep --quiet --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --implementation emulated
       --layout tp2-ep1-cp1+ring --path extend --no-grads)
expect(0 run --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --implementation emulated --layout tp2-ep1-cp2
       --path decode --lengths 7 --no-grads --out a.safetensors)
expect(0 run --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --path extend --lengths 7 --no-grads
       --out b.safetensors)
expect(0 diff --quiet a.safetensors b.safetensors)
file(WRITE "${prefix}/cwd/bad.json" "{\"models\": [\"qwen3-dense-tiny\"], \"colour\": 1}")
expect(2 sweep --quiet --plan bad.json --json report.json)
if(NOT EXISTS "${prefix}/cwd/report.json")
  message(FATAL_ERROR "the bad plan removed the earlier report")
endif()

# A checkpoint transformers wrote (fixtures/hf), then the same with its weights cut short.
set(ckpt "${prefix}/cwd/ckpt")
file(COPY "${SOURCE_DIR}/fixtures/hf/dense-gqa4-tied/" DESTINATION "${ckpt}")
expect(0 sweep --quiet --model ./ckpt --contract bf16-fmaseq-v1 --implementation reference --path extend --lengths 6)
# The first 4000 bytes: the header parses, the tensors' bytes are missing.
execute_process(COMMAND sh -c "head -c 4000 '${SOURCE_DIR}/fixtures/hf/dense-gqa4-tied/model.safetensors' > '${ckpt}/model.safetensors'")
execute_process(COMMAND "${prefix}/bin/bitparity" sweep --quiet --model ./ckpt --contract bf16-fmaseq-v1
  --implementation reference --path extend --lengths 6 WORKING_DIRECTORY "${prefix}/cwd"
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "model.safetensors")
  message(FATAL_ERROR "truncated checkpoint: exit ${rc}, expected 2 and a message naming the file:\n${err}")
endif()
file(REMOVE_RECURSE "${prefix}")
