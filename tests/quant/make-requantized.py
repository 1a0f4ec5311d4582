#!/usr/bin/env python3
"""Makes tests/quant/requantized.gguf: real SmolLM2 weights in the formats no fetched model holds.

Usage: make-requantized.py SMOLLM2_GGUF LIBGGML_BASE OUT

A few rows of two SmolLM2-135M tensors (blk.0.ffn_down.weight, rows of 1536, and
blk.5.attn_q.weight, rows of 576) are dequantized with gguf-py and quantized again:
to Q4_0, Q5_1, F16 and BF16 with gguf-py, and to Q5_K and IQ4_XS (which gguf-py cannot quantize)
with llama.cpp's own quantizer, `ggml_quantize_chunk` from LIBGGML_BASE (libggml-base.so of a
llama.cpp build, loaded with ctypes). Each result is a tensor named `<type>.<source tensor>` in
OUT. lucebox-quant's tests compare its dequantizers with gguf-py's on them.
"""

import ctypes
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

ROWS = 8
SOURCES = ["blk.0.ffn_down.weight", "blk.5.attn_q.weight"]
GGUF_PY_TYPES = [
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
]
GGML_TYPES = [GGMLQuantizationType.Q5_K, GGMLQuantizationType.IQ4_XS]


def ggml_quantizer(library_path: str):
    library = ctypes.CDLL(library_path)
    chunk = library.ggml_quantize_chunk
    chunk.restype = ctypes.c_size_t
    chunk.argtypes = [
        ctypes.c_int,  # enum ggml_type
        ctypes.c_void_p,  # const float * src
        ctypes.c_void_p,  # void * dst
        ctypes.c_int64,  # start
        ctypes.c_int64,  # nrows
        ctypes.c_int64,  # n_per_row
        ctypes.c_void_p,  # const float * imatrix
    ]
    row_size = library.ggml_row_size
    row_size.restype = ctypes.c_size_t
    row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def quantize_with_ggml(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float32)
        rows, n = values.shape
        out = np.zeros((rows, row_size(qtype.value, n)), dtype=np.uint8)
        written = chunk(qtype.value, values.ctypes.data, out.ctypes.data, 0, rows, n, None)
        assert written == out.size, (qtype.name, written, out.size)
        return out

    return quantize_with_ggml


def main(args: list[str]) -> int:
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    model, library, out = args
    quantize_with_ggml = ggml_quantizer(library)
    reader = GGUFReader(model)
    tensors = {t.name: t for t in reader.tensors}
    writer = GGUFWriter(out, arch="lucebox-quant-fixture")
    writer.add_string("lucebox.fixture.source", "smollm2-135m-instruct-q4_1: " + ", ".join(SOURCES))
    for source in SOURCES:
        tensor = tensors[source]
        values = dequantize(tensor.data[:ROWS], tensor.tensor_type)
        short = source.removesuffix(".weight")
        for qtype in GGUF_PY_TYPES:
            data = quantize(values, qtype)
            if qtype == GGMLQuantizationType.F16:
                writer.add_tensor(f"{qtype.name.lower()}.{short}", data)
            else:
                writer.add_tensor(f"{qtype.name.lower()}.{short}", data, raw_dtype=qtype)
        if values.shape[1] % 256 == 0:
            for qtype in GGML_TYPES:
                data = quantize_with_ggml(values, qtype)
                writer.add_tensor(f"{qtype.name.lower()}.{short}", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
