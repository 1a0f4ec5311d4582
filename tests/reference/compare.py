"""Comparing the reference's logits with another implementation's (shared by the cross-checks)."""

from __future__ import annotations

import numpy as np


def default_sequences(vocab: int) -> list[list[int]]:
    """Fixed pseudo-random sequences of 1, 17 and 100 tokens."""
    rng = np.random.default_rng(20261129)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in (1, 17, 100)]


def compare_logits(
    label: str, ours: list[np.ndarray], theirs: list[np.ndarray], relative_tolerance: float, near_tie: float
) -> bool:
    """Prints one line per sequence; true when every sequence agrees.

    A sequence agrees when, at every position, the largest |theirs - ours| is within
    relative_tolerance of the spread (max - min) of our logits there, and the argmax matches
    wherever our top-two margin is at least near_tie.
    """
    ok = True
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a.shape != b.shape:
            print(f"{label} seq {i}: shape {a.shape}, other {b.shape}: MISMATCH")
            ok = False
            continue
        diff = np.abs(a - b)
        relative = float(np.max(diff.max(axis=1) / (a.max(axis=1) - a.min(axis=1))))
        top = np.sort(a, axis=1)
        margin = top[:, -1] - top[:, -2]
        same = np.argmax(a, axis=1) == np.argmax(b, axis=1)
        decisive_disagreements = int(np.sum(~same & (margin >= near_tie)))
        verdict = "ok" if relative <= relative_tolerance and decisive_disagreements == 0 else "MISMATCH"
        ok &= verdict == "ok"
        print(
            f"{label} seq {i} ({a.shape[0]} tokens): max |diff| {diff.max():.3e}, relative to row "
            f"spread {relative:.3e}, argmax agreement {np.mean(same):.3f}, disagreements with "
            f"margin >= {near_tie:g}: {decisive_disagreements}: {verdict}"
        )
    return ok
