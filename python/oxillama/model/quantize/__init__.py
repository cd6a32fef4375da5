"""`oxillama quantize`: GGUF files quantized as llama-quantize does it, with
the quantizers of the Rust core."""

from oxillama.model.quantize.ftypes import FILE_TYPES, FileType
from oxillama.model.quantize.run import QuantizeResult, TensorResult, file_type, quantize

__all__ = ["FILE_TYPES", "FileType", "QuantizeResult", "TensorResult", "file_type", "quantize"]
