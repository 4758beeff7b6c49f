"""Thin wrappers over the `bitparity` CLI, for notebooks and RL frameworks' tests:
each runs the binary (subprocess), parses the JSON report it wrote, and returns a
CliResult. The binary is $BITPARITY_EXE, else `bitparity` on PATH.

Exit codes are the CLI's (docs/reports.md): 0 exact, 1 a difference, 2 bad input,
3 an internal error or a failed case, 125 nothing could be tested here, 130
interrupted. 2 and 3 raise BitparityError with the CLI's message; 0, 1 and 125
return, `exact` saying which.
"""

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

EXIT_EXACT, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_CANNOT_TEST = 0, 1, 2, 3, 125


class BitparityError(RuntimeError):
    """The CLI refused its input (exit 2) or failed (3): its message and exit code."""

    def __init__(self, message, returncode):
        super().__init__(message)
        self.returncode = returncode


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    report: dict = field(default_factory=dict)  # the JSON report, where the command writes one

    @property
    def exact(self):
        return self.returncode == EXIT_EXACT

    @property
    def first_difference(self):
        """The first differing tensor's name in the report (bisect: execution order), or None."""
        for case in self.report.get("cases", []):
            for t in case.get("tensors", []):
                if not t.get("bit_identical", True):
                    return t["name"]
        return None


def executable():
    exe = os.environ.get("BITPARITY_EXE") or shutil.which("bitparity")
    if not exe:
        raise BitparityError("the bitparity binary was not found: set BITPARITY_EXE or put bitparity on PATH "
                             "(README: build it with `make demo`)", EXIT_BAD_INPUT)
    return exe


def _call(args, report=True):
    with tempfile.TemporaryDirectory(prefix="bitparity-") as tmp:
        path = os.path.join(tmp, "report.json")
        cmd = [executable()] + [str(a) for a in args] + (["--json", path] if report else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode in (EXIT_BAD_INPUT, EXIT_INTERNAL):
            raise BitparityError((p.stderr or p.stdout).strip() or f"{cmd[1]} exited {p.returncode}", p.returncode)
        parsed = {}
        if report and os.path.exists(path):
            with open(path) as f:
                parsed = json.load(f)
        return CliResult(p.returncode, p.stdout, p.stderr, parsed)


def diff(a, b):
    """`bitparity diff A B`: every tensor of two dumps compared bit for bit."""
    return _call(["diff", a, b])


def bisect(a, b):
    """`bitparity bisect A B`: the first op, in execution order, whose bits differ."""
    return _call(["bisect", a, b])


def conform(dump, model, contract=None):
    """`bitparity conform`: each op of the capture judged alone against the contract
    (computed by the oracle from the capture's own inputs); `report` lists every op."""
    return _call(["conform", dump, "--model", model] + (["--contract", contract] if contract else []))


def merge(out, dumps):
    """`bitparity merge`: per-rank captures of a tensor-parallel engine as one unsharded dump."""
    return _call(["merge", "--quiet", "--out", out] + list(dumps), report=False)


def run(out, model, tokens=None, contract=None, implementation=None, layout=None, path=None, capture_ops=True,
        grads=True, extra=()):
    """`bitparity run`: one case of the oracle (or an implementation) written to the dump `out`.
    `tokens` is a tokens file, or a capture's metadata["bitparity.tokens"] text."""
    args = ["run", "--out", out, "--model", model, "--capture", "ops" if capture_ops else "none"]
    with tempfile.TemporaryDirectory(prefix="bitparity-") as tmp:
        if tokens is not None:
            if tokens.lstrip().startswith("{"):  # the text itself, not a file name
                text, tokens = tokens, os.path.join(tmp, "tokens.json")
                with open(tokens, "w") as f:
                    f.write(text)
            args += ["--tokens", tokens]
        for flag, value in (("--contract", contract), ("--implementation", implementation), ("--layout", layout),
                            ("--path", path)):
            if value is not None:
                args += [flag, value]
        if not grads:
            args.append("--no-grads")
        return _call(args + list(extra), report=False)
