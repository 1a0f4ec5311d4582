#!/usr/bin/env python3
"""The independent reference for lucebox-quant's dequantizers: gguf-py's `gguf.quants.dequantize`.

Usage: dequantize.py TYPE IN OUT [TYPE IN OUT ...]

Each IN holds raw GGUF block bytes of type TYPE (a ggml type name such as Q4_K); the dequantized
values are written to OUT as little-endian float32. Several jobs run in one process, so that
numpy and gguf are imported once.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main(args: list[str]) -> int:
    if not args or len(args) % 3 != 0:
        print(__doc__, file=sys.stderr)
        return 2
    for i in range(0, len(args), 3):
        type_name, source, destination = args[i:i + 3]
        qtype = GGMLQuantizationType[type_name]
        data = np.fromfile(source, dtype=np.uint8)
        values = dequantize(data, qtype)
        np.asarray(values, dtype="<f4").tofile(destination)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
