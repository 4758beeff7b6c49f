"""The package's build: pure Python, plus `bitparity._C` (docs/torch-ops.md) where torch's
C++ headers are present: the contract's ops, compiled from the repository's own reference
sources with the project's numerics flags (SPEC.md §3), bound to torch tensors.

With a CUDA torch and nvcc, `bitparity._C` also runs CUDA tensors on optimized/cuda's
kernels: the project's CMake builds them (its target bp_cuda, position-independent, the
project's `--fmad=false` flags) and the extension links them. BITPARITY_CUDA=on|off|auto
(auto: where a CUDA torch and nvcc are present, and CPU tensors only, with a message, where
the kernels' build fails; on: that failure stops the install); BITPARITY_CUDA_BUILD=DIR
links the bp_cuda of a build folder made before (cmake -DBITPARITY_CUDA=ON
-DCMAKE_POSITION_INDEPENDENT_CODE=ON) instead of building it.

Without torch's headers (on Debian: libtorch-dev, pybind11-dev) the package installs
without it and `bitparity.ops` says what was missing. BITPARITY_REQUIRE_OPS=1 makes a
failed extension build an error (the tests' install sets it).
"""

import glob
import os
import subprocess
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# SPEC.md §3: no contraction into FMA, no fast-math, SSE arithmetic; OpenMP as the
# reference's CMake target has it (parallel loops, never an OpenMP reduction).
STRICT_FP = ["-std=c++20", "-O2", "-ffp-contract=off", "-fno-fast-math", "-mfpmath=sse", "-msse2", "-fopenmp"]


def reference_sources():
    """The reference ops and what they need, relative to this folder (setuptools' rule)."""
    found = sorted(glob.glob(os.path.join(ROOT, "reference", "ops", "*.cpp")))
    found += [os.path.join(ROOT, "reference", "contract", "contract.cpp"),
              os.path.join(ROOT, "reference", "common", "sha256.cpp")]
    return [os.path.relpath(p, HERE) for p in found]


def cuda_mode():
    """BITPARITY_CUDA: on (CUDA required), off, or auto (CUDA where a CUDA torch and nvcc are,
    the CPU alone where its build fails, saying why)."""
    mode = os.environ.get("BITPARITY_CUDA", "auto").lower()
    if mode not in ("on", "off", "auto"):
        sys.exit(f"bitparity: BITPARITY_CUDA={mode!r}: on, off or auto")
    if mode == "auto":
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
        if torch.version.cuda is None or CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin",
                                                                                                 "nvcc")):
            return "off"
    return mode


def cuda_library():
    """optimized/cuda's static library (bp_cuda), from BITPARITY_CUDA_BUILD or built by the
    project's CMake here (it needs the project's packages: Eigen, nlohmann/json, CLI11); its
    path. OSError or CalledProcessError where it cannot be had."""
    build = os.environ.get("BITPARITY_CUDA_BUILD")
    if not build:
        build = os.path.join(HERE, "build", "cmake-cuda")
        for cmd in (["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBITPARITY_CUDA=ON",
                     "-DBITPARITY_TESTS=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON"],
                    ["cmake", "--build", build, "--target", "bp_cuda", "-j", str(os.cpu_count() or 2)]):
            print("bitparity:", " ".join(cmd), file=sys.stderr)
            subprocess.run(cmd, check=True)
    lib = os.path.join(build, "optimized", "libbp_cuda.a")
    if not os.path.exists(lib):
        raise FileNotFoundError(f"no {lib}: BITPARITY_CUDA_BUILD names a CMake build folder with bp_cuda built "
                                "(-DBITPARITY_CUDA=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON)")
    return lib


def cuda_args(mode):
    """The extension's additions for CUDA tensors, or {} where they cannot be built in auto mode."""
    from torch.utils.cpp_extension import CUDA_HOME, include_paths, library_paths
    try:
        lib = cuda_library()
    except (OSError, subprocess.CalledProcessError) as e:
        if mode == "on":
            sys.exit(f"bitparity: BITPARITY_CUDA=on, but optimized/cuda did not build: {e}")
        print(f"bitparity: optimized/cuda did not build ({e}): bitparity.ops will run CPU tensors only "
              "(BITPARITY_CUDA=on makes this an error)", file=sys.stderr)
        return {}
    try:
        cuda_include = include_paths(device_type="cuda")  # torch >= 2.6
    except TypeError:
        cuda_include = include_paths(cuda=True)
    # The kernels' static runtime, as every CUDA target of the project links it (cmake/Cuda.cmake);
    # c10_cuda for torch's current stream.
    return dict(include_dirs=cuda_include, extra_compile_args=["-DBITPARITY_WITH_CUDA"],
                extra_objects=[lib, os.path.join(CUDA_HOME, "lib64", "libcudart_static.a")],
                library_dirs=library_paths(), libraries=["c10_cuda", "dl", "rt", "pthread"])


def extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        print(f"bitparity: no torch C++ build support ({e}): installing without bitparity.ops", file=sys.stderr)
        return {}
    if not os.path.isdir(os.path.join(ROOT, "reference", "ops")):
        print("bitparity: no reference sources beside this folder: installing without bitparity.ops", file=sys.stderr)
        return {}
    args = dict(include_dirs=[ROOT], extra_compile_args=list(STRICT_FP), extra_link_args=["-fopenmp"])
    mode = cuda_mode()
    if mode != "off":
        for key, more in cuda_args(mode).items():
            args[key] = args.get(key, []) + more
    ext = CppExtension("bitparity._C", ["csrc/ops.cpp"] + reference_sources(),
                       optional=os.environ.get("BITPARITY_REQUIRE_OPS") != "1", **args)
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**extension())
