#!/usr/bin/env python3
"""Derive a small qwen3-architecture GGUF from a real qwen2 GGUF (Qwen2.5-Coder-0.5B).

    python tests/reference/make_qwen3_variant.py --source QWEN2.gguf --out QWEN3.gguf [--blocks 4]

No real qwen3 model is reachable here, so this builds one that exercises what qwen3 adds: the
first N blocks of the source, general.architecture = qwen3 with every `qwen2.*` key renamed to
`qwen3.*` and block_count = N, the q/k/v biases dropped, and per-head RMSNorm weights
blk.N.attn_q_norm.weight / attn_k_norm.weight (F32, [head_dim]) added with a deterministic
pattern around 1.0. Every other tensor is copied byte for byte with its quant type. The model is
not a trained qwen3: it is a fixture whose logits the reference and the engine must agree on.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from gguf_copy import metadata_items

SOURCE_ARCH = "qwen2"
TARGET_ARCH = "qwen3"
BLOCK = re.compile(r"^blk\.(\d+)\.")


def norm_pattern(head_dim: int, layer: int, phase: float) -> np.ndarray:
    """Weights in [0.75, 1.25], different per layer and for q and k, never all equal."""
    j = np.arange(head_dim, dtype=np.float64)
    return (1.0 + 0.25 * np.sin(0.37 * j + 1.1 * layer + phase)).astype(np.float32)


def copy_metadata(reader: GGUFReader, writer: GGUFWriter, blocks: int) -> int:
    """Copies every key (qwen2.* renamed), sets block_count; returns the head dimension."""
    source_blocks = None
    n_embd = n_head = head_dim = None
    for key, value, vtype, sub_type in metadata_items(reader):
        if key.startswith(f"{SOURCE_ARCH}."):
            key = f"{TARGET_ARCH}." + key[len(SOURCE_ARCH) + 1 :]
        if key == f"{TARGET_ARCH}.block_count":
            source_blocks = value
            value = blocks
        elif key == "general.name":
            value = f"{value} (qwen3 test variant, {blocks} blocks)"
        elif key == f"{TARGET_ARCH}.embedding_length":
            n_embd = value
        elif key == f"{TARGET_ARCH}.attention.head_count":
            n_head = value
        elif key == f"{TARGET_ARCH}.attention.key_length":
            head_dim = value
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    if source_blocks is None or n_embd is None or n_head is None:
        raise ValueError(f"source is not a {SOURCE_ARCH} model: block_count, embedding_length or head_count missing")
    if not 0 < blocks <= source_blocks:
        raise ValueError(f"--blocks {blocks} must be within 1..{source_blocks}")
    return head_dim or n_embd // n_head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, type=Path, help="a qwen2 GGUF (Qwen2.5-Coder-0.5B)")
    parser.add_argument("--out", required=True, type=Path, help="the qwen3 GGUF to write")
    parser.add_argument("--blocks", type=int, default=4, help="blocks to keep (default 4)")
    args = parser.parse_args()

    reader = GGUFReader(args.source)
    arch = reader.get_field("general.architecture")
    if arch is None or arch.contents() != SOURCE_ARCH:
        print(f"make_qwen3_variant: error: {args.source} is not a {SOURCE_ARCH} model", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(args.out, arch=TARGET_ARCH)
    try:
        head_dim = copy_metadata(reader, writer, args.blocks)
    except ValueError as err:
        print(f"make_qwen3_variant: error: {err}", file=sys.stderr)
        return 2

    for tensor in reader.tensors:
        block = BLOCK.match(tensor.name)
        if block and int(block.group(1)) >= args.blocks:
            continue
        if block and tensor.name.endswith(".bias"):
            continue
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    for layer in range(args.blocks):
        for which, phase in (("q", 0.0), ("k", 2.0)):
            writer.add_tensor(
                f"blk.{layer}.attn_{which}_norm.weight",
                norm_pattern(head_dim, layer, phase),
                raw_dtype=GGMLQuantizationType.F32,
            )

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"make_qwen3_variant: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
