"""Dumps: safetensors files of named tensors and string metadata, read and written
without the safetensors wheel (absent from Debian), byte-compatible with what the
`bitparity` CLI reads and writes (harness/io/safetensors.h).

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}, "__metadata__": {str: str}}, then the tensors' bytes, little endian,
row major. The header is padded with spaces to a multiple of 8.
"""

import json
import math
import os
import struct
import tempfile

import torch

_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I32": torch.int32,
    "I64": torch.int64,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
# Each dtype's bytes are read through an integer view of the same width, so that
# bf16 needs no numpy support.
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64, torch.int32: torch.int32, torch.int64: torch.int64}


class DumpError(ValueError):
    """A dump that cannot be read: the file and what is wrong with it."""


def _bytes_of(t):
    t = t.detach().to("cpu").contiguous()
    return t.view(_BITS[t.dtype]).numpy().astype(_little(_BITS[t.dtype]), copy=False).tobytes()


def _little(int_dtype):
    return {torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8"}[int_dtype]


def write_dump(path, tensors, metadata=None):
    """Writes `tensors` ({name: torch.Tensor}) and `metadata` ({str: str}) to `path`
    atomically (a temporary beside it, renamed over it): an error never leaves a
    partial dump or touches an earlier one."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _NAMES:
            raise TypeError(f"{name}: dtype {t.dtype} cannot be written (bitparity dumps take {sorted(_DTYPES)})")
        data = _bytes_of(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"metadata must map str to str: {bad[0]!r}")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_dump(path):
    """Returns ({name: tensor}, {metadata}) of a dump; DumpError naming the file and
    the field when it is not one."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise DumpError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise DumpError(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise DumpError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise DumpError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]  # a view: each tensor's bytes are copied once, below
    tensors = {}
    for name, spec in header.items():
        try:
            dtype = _DTYPES[spec["dtype"]]
            shape = [int(s) for s in spec["shape"]]
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise DumpError(f"{path}: {name}: expected dtype (one of {sorted(_DTYPES)}), shape and data_offsets") from None
        count = math.prod(shape)
        width = torch.tensor([], dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != count * width:
            raise DumpError(f"{path}: {name}: data_offsets [{begin}, {end}] do not hold {shape} {spec['dtype']}")
        raw = bytearray(body[begin:end])
        bits = torch.frombuffer(raw, dtype=_BITS[dtype]) if raw else torch.empty(0, dtype=_BITS[dtype])
        tensors[name] = bits.view(dtype).reshape(shape)  # owns `raw`, the one copy
    return tensors, metadata
