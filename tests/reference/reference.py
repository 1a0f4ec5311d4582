#!/usr/bin/env python3
"""Reference logits for token sequences, computed in float64 from a GGUF model.

    python tests/reference/reference.py --model PATH --input IN.json --out DIR [--kv-cache f64|f16]

IN.json is {"sequences": [[token ids...], ...]}. For each sequence i this writes
DIR/logits-<i>.f32 (little-endian float32, row-major [n_tokens, vocab]: the logits at every
position) and DIR/summary.json with, per sequence, the float64 argmax at each position, the
runner-up and the margin between the top two logits (so that a near-tie can be recognised).
Timings go to stderr. Exit status 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from model import GgufModel, ModelError, forward, log


def read_sequences(path: Path) -> list[list[int]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelError(f"input {path}: {err}") from err
    sequences = doc.get("sequences") if isinstance(doc, dict) else None
    if not isinstance(sequences, list):
        raise ModelError(f"input {path}: expected an object with a list under \"sequences\"")
    for i, seq in enumerate(sequences):
        if not isinstance(seq, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
            raise ModelError(f"input {path}: sequences[{i}] is not a list of integers")
    return sequences


def summarize(logits: np.ndarray) -> dict:
    """Per position: the argmax, the runner-up and the top-two margin, from the float64 logits.

    Exact ties resolve to the lowest id, as np.argmax (and a greedy sampler scanning the row) does.
    """
    rows = np.arange(logits.shape[0])
    best = np.argmax(logits, axis=1)
    others = logits.copy()
    others[rows, best] = -np.inf
    second = np.argmax(others, axis=1)
    return {
        "n_tokens": int(logits.shape[0]),
        "vocab": int(logits.shape[1]),
        "argmax": best.tolist(),
        "runner_up": second.tolist(),
        "margin": (logits[rows, best] - logits[rows, second]).tolist(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="GGUF model file")
    parser.add_argument("--input", required=True, type=Path, help='JSON file {"sequences": [[ids...], ...]}')
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    parser.add_argument(
        "--kv-cache",
        choices=["f64", "f16"],
        default="f64",
        help="precision K and V are stored in: f64 (exact, default) or f16 (as an f16 KV cache rounds them)",
    )
    args = parser.parse_args()

    try:
        started = time.perf_counter()
        sequences = read_sequences(args.input)
        model = GgufModel(str(args.model))
        log(f"opened {args.model} in {time.perf_counter() - started:.1f} s")
        all_logits = forward(model, sequences, args.kv_cache)
    except (ModelError, OSError, ValueError) as err:
        print(f"reference: error: {err}", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for i, logits in enumerate(all_logits):
        logits.astype("<f4").tofile(args.out / f"logits-{i}.f32")
        summary.append(summarize(logits))
    (args.out / "summary.json").write_text(json.dumps({"model": str(args.model), "sequences": summary}))
    log(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
