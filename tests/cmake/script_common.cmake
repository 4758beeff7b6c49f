# Shared by the CTest scripts run as `cmake -P` (fastmath_refusal, installed_binary).

# bp_require(<script> <var>...): fail naming the script unless every var is set.
function(bp_require script)
  foreach(v IN LISTS ARGN)
    if(NOT DEFINED ${v})
      message(FATAL_ERROR "${script}: ${v} is not set")
    endif()
  endforeach()
endfunction()

# bp_scratch_dir(<out-var> <parent> <stem>): a fresh, empty <parent>/<stem>-<random>.
function(bp_scratch_dir out parent stem)
  string(RANDOM LENGTH 10 ALPHABET "abcdefghijklmnopqrstuvwxyz0123456789" tag)
  set(dir "${parent}/${stem}-${tag}")
  file(REMOVE_RECURSE "${dir}")
  file(MAKE_DIRECTORY "${dir}")
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()
