# Strict floating point for every target (SPEC.md §3). Fast-math style flags make
# results depend on the compiler's whim (contraction, reassociation, FTZ/DAZ set
# process-wide), which is exactly what bitparity exists to rule out: refuse them.

set(_bp_forbidden_host "-ffast-math" "-Ofast" "-funsafe-math-optimizations" "-ffinite-math-only"
    "-fassociative-math" "-freciprocal-math" "-ffp-contract=fast" "-ffp-contract=on")
set(_bp_forbidden_cuda "--use_fast_math" "-use_fast_math" "--ftz=true" "-ftz=true" "--fmad=true"
    "-fmad=true" "--prec-div=false" "-prec-div=false" "--prec-sqrt=false" "-prec-sqrt=false")

function(_bp_refuse_flags var forbidden)
  foreach(flag IN LISTS forbidden)
    string(FIND " ${${var}} " " ${flag} " hit)
    if(NOT hit EQUAL -1)
      message(FATAL_ERROR
        "bitparity: ${var} contains '${flag}'. bitparity defines the bits of every op; "
        "${flag} lets the compiler contract, reassociate or flush values, so results would no "
        "longer follow reference/SPEC.md. Remove it (see SPEC.md section 3, 'Floating-point hygiene').")
    endif()
  endforeach()
endfunction()

set(_bp_host_vars CMAKE_CXX_FLAGS CMAKE_C_FLAGS)
foreach(cfg DEBUG RELEASE RELWITHDEBINFO MINSIZEREL)
  list(APPEND _bp_host_vars CMAKE_CXX_FLAGS_${cfg} CMAKE_C_FLAGS_${cfg})
endforeach()
foreach(var IN LISTS _bp_host_vars)
  _bp_refuse_flags(${var} "${_bp_forbidden_host}")
endforeach()
foreach(var CMAKE_CUDA_FLAGS CMAKE_CUDA_FLAGS_RELEASE CMAKE_CUDA_FLAGS_DEBUG CMAKE_CUDA_FLAGS_RELWITHDEBINFO)
  _bp_refuse_flags(${var} "${_bp_forbidden_cuda};${_bp_forbidden_host}")
endforeach()
# CUDA host-compiler pass-through flags are checked like host flags.
_bp_refuse_flags(CMAKE_CUDA_HOST_FLAGS "${_bp_forbidden_host}")

add_library(bp_strict_fp INTERFACE)
target_compile_options(bp_strict_fp INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off;-fno-fast-math>"
  "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wno-unused-command-line-argument>"
  "$<$<COMPILE_LANGUAGE:CUDA>:--fmad=false;--prec-div=true;--prec-sqrt=true;--ftz=false;-Xcompiler=-ffp-contract=off>")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  # SSE arithmetic, never the x87 unit with its 80-bit temporaries.
  target_compile_options(bp_strict_fp INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:-mfpmath=sse;-msse2>")
endif()
