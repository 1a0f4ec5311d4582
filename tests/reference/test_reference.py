"""Internal consistency checks of the reference forward pass.

    python -m unittest discover -s tests/reference -v

The RoPE checks are synthetic. The model checks need the fetched models (see
crates/testkit: $LUCEBOX_MODEL_DIR, else $XDG_CACHE_HOME/lucebox/models, else
~/.cache/lucebox/models) and fail, naming the file, when one is missing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gguf import GGUFReader  # noqa: E402

import model as ref  # noqa: E402

CODE_AND_PROSE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
    "The quick brown fox jumps over the lazy dog. The capital of France is Paris."
)


def model_path(name: str) -> Path:
    if "LUCEBOX_MODEL_DIR" in os.environ:
        base = Path(os.environ["LUCEBOX_MODEL_DIR"])
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = Path(cache) / "lucebox" / "models"
    path = base / f"{name}.gguf"
    if not path.is_file():
        raise AssertionError(f"model {name} not found at {path}: run `lucebox fetch {name}` or tests/run-all")
    return path


@functools.cache
def open_model(path: Path) -> ref.GgufModel:
    """Opened once per test run: parsing a GGUF's vocabulary takes seconds."""
    return ref.GgufModel(str(path))


def with_hparams(model: ref.GgufModel, **changes) -> ref.GgufModel:
    """A copy of the model (sharing its weights) with some hyperparameters changed."""
    changed = copy.copy(model)
    changed.hp = dataclasses.replace(model.hp, **changes)
    return changed


def byte_level_tokens(vocab: list[str], text: str) -> list[int]:
    """Greedy longest match over a byte-level BPE vocabulary (GPT-2 byte-to-unicode mapping).

    Not the model's exact BPE segmentation, but every piece is a real vocabulary entry and the
    text reads naturally to the model, which is all the likelihood check needs.
    """
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    encoded = "".join(mapping[b] for b in text.encode())
    index = {piece: i for i, piece in enumerate(vocab)}
    longest = max(len(piece) for piece in vocab)
    ids, pos = [], 0
    while pos < len(encoded):
        for length in range(min(longest, len(encoded) - pos), 0, -1):
            if encoded[pos : pos + length] in index:
                ids.append(index[encoded[pos : pos + length]])
                pos += length
                break
        else:
            raise AssertionError(f"no vocabulary entry starts with {encoded[pos]!r}")
    return ids


def mean_next_token_nll(logits: np.ndarray, ids: list[int]) -> float:
    shifted = logits[:-1] - logits[:-1].max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean(log_probs[np.arange(len(ids) - 1), ids[1:]]))


def rope_params(n_rot: int, head_dim: int, neox: bool) -> ref.HParams:
    return ref.HParams(
        arch="qwen2" if neox else "llama",
        n_layer=1,
        n_embd=head_dim,
        n_head=1,
        n_head_kv=1,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_rot=n_rot,
        rope_neox=neox,
        freq_base=10000.0,
        freq_scale=1.0,
        rms_eps=1e-6,
        attn_scale=1.0,
        vocab=1,
    )


class RopeTest(unittest.TestCase):
    def setUp(self) -> None:
        self.rng = np.random.default_rng(7)

    def test_scores_depend_only_on_relative_position(self) -> None:
        for neox in (False, True):
            for n_rot in (64, 32):
                hp = rope_params(n_rot, 64, neox)
                q = self.rng.standard_normal((1, 1, 64))
                k = self.rng.standard_normal((1, 1, 64))

                def score(pq: int, pk: int) -> float:
                    return float(np.sum(ref.rope(q, np.array([pq]), hp) * ref.rope(k, np.array([pk]), hp)))

                self.assertAlmostEqual(score(5, 2), score(105, 102), places=9)
                self.assertAlmostEqual(score(0, 0), float(np.sum(q * k)), places=9)
                self.assertNotAlmostEqual(score(5, 2), score(5, 3), places=3)

    def test_rotates_only_the_first_n_rot_dims_and_keeps_norms(self) -> None:
        for neox in (False, True):
            hp = rope_params(32, 64, neox)
            x = self.rng.standard_normal((3, 2, 64))
            y = ref.rope(x, np.array([0, 7, 300]), hp)
            np.testing.assert_array_equal(y[..., 32:], x[..., 32:])
            np.testing.assert_array_equal(y[0], x[0])
            np.testing.assert_allclose(np.linalg.norm(y[..., :32], axis=-1), np.linalg.norm(x[..., :32], axis=-1))

    def test_pair_layout_and_frequencies_follow_ggml(self) -> None:
        # ggml rope: theta_i = pos * base^(-2i/n_rot) for pair i; NORM pairs dims (2i, 2i+1),
        # NEOX pairs dims (i, i + n_rot/2).
        head_dim, n_rot, pos, i = 16, 16, 3, 2
        theta = pos * 10000.0 ** (-2.0 * i / n_rot)
        for neox, (a, b) in ((False, (2 * i, 2 * i + 1)), (True, (i, i + n_rot // 2))):
            x = np.zeros((1, 1, head_dim))
            x[0, 0, a] = 1.0
            y = ref.rope(x, np.array([pos]), rope_params(n_rot, head_dim, neox))[0, 0]
            expected = np.zeros(head_dim)
            expected[a], expected[b] = np.cos(theta), np.sin(theta)
            np.testing.assert_allclose(y, expected, atol=1e-15)


class ModelTest(unittest.TestCase):
    """Checks on the real models: causality, batching, and that the model reads real text well."""

    def check_prefix_and_batch(self, name: str) -> None:
        model = open_model(model_path(name))
        rng = np.random.default_rng(1)
        full = [int(t) for t in rng.integers(0, model.hp.vocab, 12)]
        other = [int(t) for t in rng.integers(0, model.hp.vocab, 5)]
        together = ref.forward(model, [full, other, full[:7]])
        alone = ref.forward(model, [other])[0]
        np.testing.assert_allclose(together[2], together[0][:7], rtol=0, atol=1e-9)
        np.testing.assert_allclose(together[1], alone, rtol=0, atol=1e-9)

    def check_reads_text(self, name: str) -> None:
        model = open_model(model_path(name))
        vocab = model.reader.get_field("tokenizer.ggml.tokens").contents()
        ids = byte_level_tokens(vocab, CODE_AND_PROSE)
        shuffled = [int(t) for t in np.random.default_rng(0).permutation(ids)]
        natural, scrambled = ref.forward(model, [ids, shuffled])
        nll = mean_next_token_nll(natural, ids)
        self.assertLess(nll, 3.0, f"{name}: mean next-token NLL on plain text")
        self.assertGreater(mean_next_token_nll(scrambled, shuffled), nll + 4.0)
        # The other RoPE pair layout reads the same text worse (by 2.5 nats for SmolLM2, 0.44 for
        # Qwen2.5-0.5B, which copes with it surprisingly well): the chosen layout is the right one.
        other_layout = with_hparams(model, rope_neox=not model.hp.rope_neox)
        self.assertGreater(mean_next_token_nll(ref.forward(other_layout, [ids])[0], ids), nll + 0.25)

    def test_llama_prefix_and_batch(self) -> None:
        self.check_prefix_and_batch("smollm2-135m-instruct-q4_1")

    def test_llama_reads_text(self) -> None:
        self.check_reads_text("smollm2-135m-instruct-q4_1")

    def test_qwen2_reads_text(self) -> None:
        self.check_reads_text("qwen2.5-coder-0.5b-instruct-q4_k_m")


class Qwen3VariantTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.source = model_path("qwen2.5-coder-0.5b-instruct-q4_k_m")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.variant = Path(cls.tmp.name) / "qwen3-variant.gguf"
        subprocess.run(
            [sys.executable, str(HERE / "make_qwen3_variant.py"), "--source", str(cls.source), "--out", str(cls.variant)],
            check=True,
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def test_variant_layout(self) -> None:
        source = GGUFReader(self.source)
        variant = GGUFReader(self.variant)
        self.assertEqual(variant.get_field("general.architecture").contents(), "qwen3")
        self.assertEqual(variant.get_field("qwen3.block_count").contents(), 4)
        self.assertFalse([f for f in variant.fields if f.startswith("qwen2.")])
        src = {t.name: t for t in source.tensors}
        for tensor in variant.tensors:
            self.assertFalse(tensor.name.endswith(".bias"), tensor.name)
            if tensor.name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
                self.assertEqual(tensor.shape.tolist(), [64])
                self.assertGreater(np.ptp(tensor.data), 0.1)
                self.assertLess(np.max(np.abs(tensor.data - 1.0)), 0.3)
                continue
            original = src[tensor.name]
            self.assertEqual(tensor.tensor_type, original.tensor_type, tensor.name)
            np.testing.assert_array_equal(tensor.data, original.data, err_msg=tensor.name)
        norms = [t.name for t in variant.tensors if t.name.endswith(("attn_q_norm.weight", "attn_k_norm.weight"))]
        self.assertEqual(len(norms), 8)

    def test_qk_norms_take_effect(self) -> None:
        model = ref.GgufModel(str(self.variant))
        ids = [9707, 11, 1879, 0, 220, 16]
        logits = ref.forward(model, [ids])[0]
        self.assertTrue(np.all(np.isfinite(logits)))
        # Evaluated as qwen2 (no q/k norms) the same weights give other logits.
        without_norms = with_hparams(model, arch="qwen2")
        self.assertGreater(np.max(np.abs(ref.forward(without_norms, [ids])[0] - logits)), 1.0)


class CliTest(unittest.TestCase):
    def test_writes_logits_and_summary(self) -> None:
        path = model_path("smollm2-135m-instruct-q4_1")
        with tempfile.TemporaryDirectory() as tmp:
            request = Path(tmp) / "in.json"
            request.write_text(json.dumps({"sequences": [[1, 504, 3458, 282], [9690]]}))
            out = Path(tmp) / "out"
            run = subprocess.run(
                [sys.executable, str(HERE / "reference.py"), "--model", str(path), "--input", str(request), "--out", str(out)],
                capture_output=True,
                text=True,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            summary = json.loads((out / "summary.json").read_text())["sequences"]
            for i, n_tokens in enumerate((4, 1)):
                logits = np.fromfile(out / f"logits-{i}.f32", dtype="<f4").reshape(n_tokens, 49152)
                entry = summary[i]
                self.assertEqual((entry["n_tokens"], entry["vocab"]), (n_tokens, 49152))
                for row, best, second, margin in zip(logits, entry["argmax"], entry["runner_up"], entry["margin"]):
                    self.assertNotEqual(best, second)
                    self.assertAlmostEqual(float(row[best] - row[second]), margin, places=4)
                    if margin > 1e-3:
                        self.assertEqual(int(np.argmax(row)), best)

    def test_rejects_bad_input(self) -> None:
        path = model_path("smollm2-135m-instruct-q4_1")
        with tempfile.TemporaryDirectory() as tmp:
            for doc, expected in (({"sequences": [[1, 49152]]}, "token id 49152"), ({"seqs": []}, "sequences")):
                request = Path(tmp) / "in.json"
                request.write_text(json.dumps(doc))
                run = subprocess.run(
                    [sys.executable, str(HERE / "reference.py"), "--model", str(path), "--input", str(request), "--out", tmp],
                    capture_output=True,
                    text=True,
                )
                self.assertEqual(run.returncode, 2)
                self.assertIn(expected, run.stderr)


if __name__ == "__main__":
    unittest.main()
