"""bitparity for PyTorch engines: capture a model's ops under bitparity's names and
check them against the bit-defined contract with the `bitparity` CLI.

    import bitparity
    with bitparity.capture(model) as cap:          # HF, vLLM and SGLang Qwen3 / Qwen3-MoE built in
        model(input_ids, attention_mask=mask)
    cap.write("engine.safetensors")
    bitparity.bisect("engine.safetensors", "trainer.safetensors")

docs/python.md has the recipe, the name-map format and what each check proves;
bitparity.ops and bitparity.patch put the contract's ops in a model (docs/torch-ops.md).
"""

from .capture import Capture, CaptureError, CaptureWarning, capture, named_gradients
from .cli import BitparityError, CliResult, bisect, conform, diff, executable, merge, run
from .dump import DumpError, read_dump, write_dump
from .name_maps import BUILT_IN as NAME_MAPS
from .ops import contract
from .patch import patch

__all__ = ["Capture", "CaptureError", "CaptureWarning", "capture", "named_gradients", "BitparityError", "CliResult", "bisect", "conform",
           "diff", "executable", "merge", "run", "DumpError", "read_dump", "write_dump", "NAME_MAPS", "contract", "patch"]
__version__ = "0.1.0"
