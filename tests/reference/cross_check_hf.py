#!/usr/bin/env python3
"""Cross-check the reference forward pass against Hugging Face transformers, both in float64.

    python tests/reference/cross_check_hf.py --model PATH.gguf [--model ...] [--input IN.json] [--device cuda]

Meant for the lent GPU machine, which has torch and transformers (carry the `gguf` and `numpy`
wheels of tests/requirements.txt there; no network is needed). transformers loads the GGUF itself
(`gguf_file=`, dequantized with gguf-py like the reference, then its own modelling code: its own
RoPE, attention, q/k norms and, for llama, its own undoing of the converter's Q/K permutation), so
agreement checks the reference's forward math, not its dequantization.

Without --input it uses fixed pseudo-random sequences of 1, 17 and 100 tokens. Prints, per model
and sequence, the largest logit difference and argmax agreement; exits 1 when a difference exceeds
the tolerance or an argmax differs where the reference's top-two margin is not a near-tie.
transformers computes RoPE angles in float32, so differences of ~1e-4 are expected; a convention
error (RoPE layout, GQA mapping, missing bias or norm) shows up as differences of order 1 or more.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import compare_logits, default_sequences  # noqa: E402
from model import GgufModel, forward  # noqa: E402

# Largest acceptable |hf - reference| relative to the spread (max - min) of the row's logits.
RELATIVE_TOLERANCE = 1e-3
# Top-two margins below this are near-ties: their argmax may legitimately differ.
NEAR_TIE = 1e-3


def hf_logits(path: Path, tied_output: bool, sequences: list[list[int]], device: str) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float64, attn_implementation="eager"
    )
    if tied_output:
        # The GGUF ties the output projection to token_embd; make sure transformers does too.
        model.lm_head.weight = model.model.embed_tokens.weight
    model.to(device).eval()
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], dtype=torch.long, device=device)
            out.append(model(input_ids=ids).logits[0].double().cpu().numpy())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, action="append", type=Path, help="GGUF file (repeatable)")
    parser.add_argument("--input", type=Path, help='JSON {"sequences": [[ids...], ...]}')
    parser.add_argument("--device", default="cpu", help="torch device for transformers (cpu, cuda)")
    args = parser.parse_args()

    all_ok = True
    for path in args.model:
        model = GgufModel(str(path))
        if args.input:
            sequences = json.loads(args.input.read_text())["sequences"]
        else:
            sequences = default_sequences(model.hp.vocab)
        started = time.perf_counter()
        ours = forward(model, sequences)
        middle = time.perf_counter()
        theirs = hf_logits(path, "output.weight" not in model.tensors, sequences, args.device)
        print(
            f"{path.name}: reference {middle - started:.1f} s, transformers {time.perf_counter() - middle:.1f} s",
            file=sys.stderr,
        )
        all_ok &= compare_logits(path.name, ours, theirs, RELATIVE_TOLERANCE, NEAR_TIE)
    print("cross-check:", "ok" if all_ok else "MISMATCH")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
