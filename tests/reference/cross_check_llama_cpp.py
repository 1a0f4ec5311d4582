#!/usr/bin/env python3
"""Cross-check the reference forward pass against llama.cpp on the CPU.

    python tests/reference/cross_check_llama_cpp.py --model PATH.gguf [--model ...] [--input IN.json]
        [--weights f32|original]

Needs a llama.cpp build with shared libraries, as tests/bench/compare-llama-cpp makes:
--llama-src (default $LLAMA_CPP_SRC, else the sdist that script unpacks) for llama.h and
--llama-build (default $LLAMA_CPP_BUILD, else that script's build directory) for libllama.so.
Compiles llama_cpp_logits.c against them, runs it on each sequence and compares.

With --weights f32 (the default) llama.cpp runs on a copy of the model whose every tensor is
dequantized to F32 (by gguf-py, as the reference does), so both evaluate the very same weights and
llama.cpp multiplies in float32 without rounding activations: they must agree to 1e-4 of the
logit spread (seen: at most 2e-5). This checks the reference's forward math against llama.cpp's
own graph. With --weights original llama.cpp runs the quantized file, rounding activations to
8 bits in its dot products; that is reported against a loose bound, for information. Seen: about
2% of the spread at most positions, argmax differing only at near-ties (margins below 0.06), but
44% at position 0 of Qwen2.5-Coder-1.5B, whose first-token activations are huge outliers that
8-bit rounding handles badly. A convention error (RoPE layout, GQA mapping, a missing bias or
norm) gives differences of the order of the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gguf import GGUFReader, GGUFWriter  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from compare import compare_logits, default_sequences  # noqa: E402
from gguf_copy import metadata_items  # noqa: E402
from model import GgufModel, forward  # noqa: E402

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# (largest |diff| relative to the row's logit spread, top-two margin below which argmax may differ)
TOLERANCES = {"f32": (1e-4, 1e-2), "original": (0.5, 0.25)}


def default_llama_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lucebox" / "llama.cpp"


def write_f32_copy(source: Path, dest: Path) -> None:
    """The same model with every tensor dequantized to F32 (general.file_type 0, all F32).

    Tensors are dequantized one at a time as they are written, so memory stays at one tensor.
    """
    reader = GGUFReader(source)
    writer = GGUFWriter(dest, arch=reader.get_field("general.architecture").contents())
    for key, value, vtype, sub_type in metadata_items(reader):
        writer.add_key_value(key, 0 if key == "general.file_type" else value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), 4 * tensor.n_elements)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
    writer.close()


def build_tool(src: Path, build: Path, workdir: Path) -> Path:
    lib_dirs = sorted({p.parent for p in build.rglob("libllama.so")})
    if not lib_dirs:
        raise SystemExit(f"cross-check: error: no libllama.so under {build} (build llama.cpp with BUILD_SHARED_LIBS=ON)")
    tool = workdir / "llama_cpp_logits"
    command = ["cc", "-O2", "-o", str(tool), str(HERE / "llama_cpp_logits.c")]
    command += [f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}"]
    for lib_dir in lib_dirs:
        command += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    command += ["-lllama", "-lggml", "-lggml-base"]
    subprocess.run(command, check=True)
    return tool


def llama_cpp_logits(tool: Path, path: Path, sequences: list[list[int]], vocab: int, workdir: Path) -> list[np.ndarray]:
    out = []
    for i, seq in enumerate(sequences):
        dest = workdir / f"llama-{i}.f32"
        subprocess.run([str(tool), str(path), str(dest), *map(str, seq)], check=True)
        out.append(np.fromfile(dest, dtype="<f4").astype(np.float64).reshape(len(seq), vocab))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, action="append", type=Path, help="GGUF file (repeatable)")
    parser.add_argument("--input", type=Path, help='JSON {"sequences": [[ids...], ...]}')
    parser.add_argument(
        "--llama-src",
        type=Path,
        default=os.environ.get("LLAMA_CPP_SRC")
        or default_llama_dir() / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp",
    )
    parser.add_argument(
        "--llama-build",
        type=Path,
        default=os.environ.get("LLAMA_CPP_BUILD") or default_llama_dir() / f"build-{LLAMA_CPP_PYTHON_VERSION}",
    )
    parser.add_argument("--weights", choices=sorted(TOLERANCES), default="f32", help="what llama.cpp runs (see above)")
    args = parser.parse_args()

    all_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tool = build_tool(Path(args.llama_src), Path(args.llama_build), workdir)
        for path in args.model:
            model = GgufModel(str(path))
            if args.input:
                sequences = json.loads(args.input.read_text())["sequences"]
            else:
                sequences = default_sequences(model.hp.vocab)
            started = time.perf_counter()
            ours = forward(model, sequences)
            middle = time.perf_counter()
            llama_model = path
            if args.weights == "f32":
                llama_model = workdir / "f32.gguf"
                write_f32_copy(path, llama_model)
            theirs = llama_cpp_logits(tool, llama_model, sequences, model.hp.vocab, workdir)
            print(
                f"{path.name}: reference {middle - started:.1f} s, llama.cpp {time.perf_counter() - middle:.1f} s",
                file=sys.stderr,
            )
            relative_tolerance, near_tie = TOLERANCES[args.weights]
            label = f"{path.name} ({args.weights} weights)"
            all_ok &= compare_logits(label, ours, theirs, relative_tolerance, near_tie)
    print("cross-check:", "ok" if all_ok else "MISMATCH")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
