"""The package's build: pure Python, plus `bitparity._C` (docs/torch-ops.md) where torch's
C++ headers are present: the contract's ops, compiled from the repository's own reference
sources with the project's numerics flags (SPEC.md §3), bound to torch tensors.

With a CUDA torch and nvcc, `bitparity._C` also runs CUDA tensors on optimized/cuda's
kernels: the project's CMake builds them (its target bp_cuda, position-independent, the
project's `--fmad=false` flags) and the extension links them. BITPARITY_CUDA=on|off|auto
(auto: a CUDA torch and nvcc present); BITPARITY_CUDA_BUILD=DIR links the bp_cuda of a
build folder made before (cmake -DBITPARITY_CUDA=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
instead of building it.

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


def wants_cuda():
    """Whether to build the CUDA path: BITPARITY_CUDA, or (auto) a CUDA torch and nvcc."""
    mode = os.environ.get("BITPARITY_CUDA", "auto").lower()
    if mode not in ("on", "off", "auto"):
        sys.exit(f"bitparity: BITPARITY_CUDA={mode!r}: on, off or auto")
    if mode != "auto":
        return mode == "on"
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
    return torch.version.cuda is not None and CUDA_HOME is not None and \
        os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


def cuda_library():
    """optimized/cuda's static library (bp_cuda), from BITPARITY_CUDA_BUILD or built by the
    project's CMake here; its path."""
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
        sys.exit(f"bitparity: no {lib}: BITPARITY_CUDA_BUILD names a CMake build folder with bp_cuda built "
                 "(-DBITPARITY_CUDA=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON)")
    return lib


def extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths, library_paths
    except ImportError as e:
        print(f"bitparity: no torch C++ build support ({e}): installing without bitparity.ops", file=sys.stderr)
        return {}
    if not os.path.isdir(os.path.join(ROOT, "reference", "ops")):
        print("bitparity: no reference sources beside this folder: installing without bitparity.ops", file=sys.stderr)
        return {}
    args = dict(include_dirs=[ROOT], extra_compile_args=list(STRICT_FP), extra_link_args=["-fopenmp"])
    if wants_cuda():
        from torch.utils.cpp_extension import CUDA_HOME
        # The kernels' static runtime, as every CUDA target of the project links it (cmake/Cuda.cmake);
        # c10_cuda for torch's current stream.
        try:
            args["include_dirs"] += include_paths(device_type="cuda")  # torch >= 2.6
        except TypeError:
            args["include_dirs"] += include_paths(cuda=True)
        args["extra_compile_args"].append("-DBITPARITY_WITH_CUDA")
        args["extra_objects"] = [cuda_library(), os.path.join(CUDA_HOME, "lib64", "libcudart_static.a")]
        args["library_dirs"] = library_paths()
        args["libraries"] = ["c10_cuda", "dl", "rt", "pthread"]
    ext = CppExtension("bitparity._C", ["csrc/ops.cpp"] + reference_sources(),
                       optional=os.environ.get("BITPARITY_REQUIRE_OPS") != "1", **args)
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**extension())
