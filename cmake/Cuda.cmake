# CUDA is optional: AUTO builds it when nvcc is found. Hopper only: sm_90, plus
# sm_90a for targets that use wgmma (bp_cuda_target(... ARCH_SPECIFIC)).
set(BP_HAVE_CUDA OFF)
set(BP_HAVE_NCCL OFF)
if(NOT BITPARITY_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CMake < 3.26 knows no C++20 flag for nvcc; nvcc >= 12 takes -std=c++20.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(BP_HAVE_CUDA ON)
    find_library(BP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    find_path(BP_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
    if(BP_NCCL_LIBRARY AND BP_NCCL_INCLUDE)
      set(BP_HAVE_NCCL ON)
    endif()
  elseif(BITPARITY_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BITPARITY_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "bitparity: CUDA backend ${BP_HAVE_CUDA}, NCCL ${BP_HAVE_NCCL}")

# Compile a CUDA target for Hopper; ARCH_SPECIFIC targets (wgmma, setmaxnreg) get
# sm_90a machine code only, since plain sm_90 rejects those instructions.
function(bp_cuda_target target)
  cmake_parse_arguments(arg "ARCH_SPECIFIC" "" "" ${ARGN})
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES OFF)
  if(arg_ARCH_SPECIFIC)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>")
    # A wgmma kernel that ptxas serialised fails the build (cmake/nvcc_guard says why).
    set_target_properties(${target} PROPERTIES CUDA_COMPILER_LAUNCHER "${PROJECT_SOURCE_DIR}/cmake/nvcc_guard")
  else()
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90,code=sm_90;-gencode=arch=compute_90a,code=sm_90a>")
  endif()
  # The static runtime: builds are carried to the GPU machine, whose CUDA
  # libraries need not sit where they sit on the build machine.
  target_link_libraries(${target} PRIVATE bp_strict_fp CUDA::cudart_static)
endfunction()
