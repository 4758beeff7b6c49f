"""The package's build: pure Python, plus `bitparity._C` (docs/torch-ops.md) where torch's
C++ headers are present: the contract's ops, compiled from the repository's own reference
sources with the project's numerics flags (SPEC.md §3), bound to torch tensors.

Without torch's headers (on Debian: libtorch-dev, pybind11-dev) the package installs
without it and `bitparity.ops` says what was missing. BITPARITY_REQUIRE_OPS=1 makes a
failed extension build an error (the tests' install sets it).
"""

import glob
import os
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


def extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        print(f"bitparity: no torch C++ build support ({e}): installing without bitparity.ops", file=sys.stderr)
        return {}
    if not os.path.isdir(os.path.join(ROOT, "reference", "ops")):
        print("bitparity: no reference sources beside this folder: installing without bitparity.ops", file=sys.stderr)
        return {}
    ext = CppExtension("bitparity._C", ["csrc/ops.cpp"] + reference_sources(), include_dirs=[ROOT],
                       extra_compile_args=STRICT_FP, extra_link_args=["-fopenmp"],
                       optional=os.environ.get("BITPARITY_REQUIRE_OPS") != "1")
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**extension())
