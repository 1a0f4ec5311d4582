"""An independent float64 forward pass for llama, qwen2 and qwen3 GGUF models.

Written from llama.cpp's conventions (src/models/{llama,qwen2,qwen3}.cpp, ggml's CPU rope) and
sharing no code with the Rust engine. Weights are read with gguf-py's GGUFReader and dequantized
with gguf.quants.dequantize; every activation is float64.

The forward pass runs layer by layer over all sequences at once, so each weight matrix is
dequantized exactly once per run and only one layer's weights are held in memory at a time.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# Rows of the output matrix dequantized and upcast at a time: bounds the float64 copy to
# OUTPUT_CHUNK_ROWS * n_embd * 8 bytes (about 100 MB for n_embd = 1536).
OUTPUT_CHUNK_ROWS = 8192


class ModelError(Exception):
    """A GGUF file this reference cannot evaluate; the message names the key or tensor."""


@dataclass(frozen=True)
class HParams:
    """Hyperparameters, all read from GGUF metadata."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    rope_neox: bool
    freq_base: float
    freq_scale: float
    rms_eps: float
    attn_scale: float
    vocab: int


def log(message: str) -> None:
    print(f"reference: {message}", file=sys.stderr, flush=True)


class GgufModel:
    """A GGUF file opened for the reference forward pass."""

    def __init__(self, path: str):
        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.hp = self._read_hparams()
        self._check_tensors()

    # --- metadata -------------------------------------------------------------------------

    def _field(self, key: str):
        field = self.reader.get_field(key)
        if field is None:
            return None
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            raise ModelError(f"metadata key {key}: per-layer arrays are not supported")
        return field.contents()

    def _required(self, key: str):
        value = self._field(key)
        if value is None:
            raise ModelError(f"metadata key {key} is missing")
        return value

    def _read_hparams(self) -> HParams:
        arch = self._required("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelError(
                f"general.architecture = {arch!r}: supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def key(name: str) -> str:
            return f"{arch}.{name}"

        n_embd = int(self._required(key("embedding_length")))
        n_head = int(self._required(key("attention.head_count")))
        n_head_kv = int(self._field(key("attention.head_count_kv")) or n_head)
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv != 0:
            raise ModelError(
                f"{key('attention.head_count')} = {n_head} is not a positive multiple of "
                f"{key('attention.head_count_kv')} = {n_head_kv}"
            )
        head_dim_k = int(self._field(key("attention.key_length")) or n_embd // n_head)
        head_dim_v = int(self._field(key("attention.value_length")) or head_dim_k)
        n_rot = int(self._field(key("rope.dimension_count")) or head_dim_k)
        if n_rot % 2 != 0 or not 0 < n_rot <= head_dim_k:
            raise ModelError(
                f"{key('rope.dimension_count')} = {n_rot} must be even and within the head size {head_dim_k}"
            )

        freq_scale = 1.0
        scaling = self._field(key("rope.scaling.type"))
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise ModelError(f"{key('rope.scaling.type')} = {scaling!r}: only none and linear are supported")
            freq_scale = 1.0 / float(self._required(key("rope.scaling.factor")))

        # Only llama.cpp's llama graph reads attention.scale; qwen2 and qwen3 always use 1/sqrt(dk).
        attn_scale = float(self._field(key("attention.scale")) or 0.0) if arch == "llama" else 0.0
        if attn_scale == 0.0:
            attn_scale = 1.0 / np.sqrt(head_dim_k)

        out = self.tensors.get("output.weight") or self.tensors.get("token_embd.weight")
        if out is None:
            raise ModelError("tensor token_embd.weight is missing")
        return HParams(
            arch=arch,
            n_layer=int(self._required(key("block_count"))),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_rot=n_rot,
            # llama.cpp's llama_model_rope_type: LLAMA_ROPE_TYPE_NORM (adjacent pairs) for llama,
            # LLAMA_ROPE_TYPE_NEOX (pairs offset by n_rot/2) for qwen2 and qwen3.
            rope_neox=arch in ("qwen2", "qwen3"),
            freq_base=float(self._field(key("rope.freq_base")) or 10000.0),
            freq_scale=freq_scale,
            rms_eps=float(self._required(key("attention.layer_norm_rms_epsilon"))),
            attn_scale=float(attn_scale),
            vocab=int(out.shape[1]),
        )

    # --- tensors ----------------------------------------------------------------------------

    def _check_shape(self, name: str, expected: tuple[int, ...]) -> None:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise ModelError(f"tensor {name} is missing")
        dims = tuple(int(d) for d in tensor.shape)
        if dims != expected:
            raise ModelError(f"tensor {name} has dims {list(dims)}, expected {list(expected)} (ggml order)")

    def _check_tensors(self) -> None:
        hp = self.hp
        if "rope_freqs.weight" in self.tensors:
            raise ModelError("tensor rope_freqs.weight (rope frequency factors) is not supported")
        self._check_shape("token_embd.weight", (hp.n_embd, hp.vocab))
        self._check_shape("output_norm.weight", (hp.n_embd,))
        if "output.weight" in self.tensors:
            self._check_shape("output.weight", (hp.n_embd, hp.vocab))
        q_out = hp.n_head * hp.head_dim_k
        kv_k = hp.n_head_kv * hp.head_dim_k
        kv_v = hp.n_head_kv * hp.head_dim_v
        for il in range(hp.n_layer):
            b = f"blk.{il}"
            self._check_shape(f"{b}.attn_norm.weight", (hp.n_embd,))
            self._check_shape(f"{b}.attn_q.weight", (hp.n_embd, q_out))
            self._check_shape(f"{b}.attn_k.weight", (hp.n_embd, kv_k))
            self._check_shape(f"{b}.attn_v.weight", (hp.n_embd, kv_v))
            self._check_shape(f"{b}.attn_output.weight", (hp.n_head * hp.head_dim_v, hp.n_embd))
            self._check_shape(f"{b}.ffn_norm.weight", (hp.n_embd,))
            self._check_shape(f"{b}.ffn_gate.weight", (hp.n_embd, self._n_ff(il)))
            self._check_shape(f"{b}.ffn_up.weight", (hp.n_embd, self._n_ff(il)))
            self._check_shape(f"{b}.ffn_down.weight", (self._n_ff(il), hp.n_embd))
            for proj, width in (("q", q_out), ("k", kv_k), ("v", kv_v)):
                if f"{b}.attn_{proj}.bias" in self.tensors:
                    self._check_shape(f"{b}.attn_{proj}.bias", (width,))
            if hp.arch == "qwen3":
                self._check_shape(f"{b}.attn_q_norm.weight", (hp.head_dim_k,))
                self._check_shape(f"{b}.attn_k_norm.weight", (hp.head_dim_k,))

    def _n_ff(self, il: int) -> int:
        gate = self.tensors.get(f"blk.{il}.ffn_gate.weight")
        if gate is None:
            raise ModelError(f"tensor blk.{il}.ffn_gate.weight is missing")
        return int(gate.shape[1])

    def weight(self, name: str) -> np.ndarray:
        """The whole tensor dequantized, float64, numpy shape (rows, row_length)."""
        tensor = self.tensors[name]
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float64)

    def optional(self, name: str) -> np.ndarray | None:
        return self.weight(name) if name in self.tensors else None

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Only the rows `ids` of a tensor (the embedding lookup), float64."""
        tensor = self.tensors[name]
        return np.asarray(dequantize(tensor.data[ids], tensor.tensor_type), dtype=np.float64)


# --- the math -------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, as ggml_rms_norm followed by the weight multiply."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    # sigmoid(x) = (1 + tanh(x/2)) / 2 without exp(-x) overflowing for large negative x.
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rope(x: np.ndarray, positions: np.ndarray, hp: HParams) -> np.ndarray:
    """Rotary embedding of x [tokens, heads, head_dim]; only the first n_rot dims rotate.

    Pair i (0 <= i < n_rot/2) turns by pos * freq_scale * base^(-2i/n_rot). NORM pairs the
    adjacent dims (2i, 2i+1); NEOX pairs dim i with dim i + n_rot/2.
    """
    half = hp.n_rot // 2
    inv_freq = hp.freq_base ** (-2.0 * np.arange(half, dtype=np.float64) / hp.n_rot)
    theta = positions.astype(np.float64)[:, None] * hp.freq_scale * inv_freq[None, :]
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    out = x.copy()
    if hp.rope_neox:
        first, second = x[..., :half], x[..., half : hp.n_rot]
        out[..., :half] = first * cos - second * sin
        out[..., half : hp.n_rot] = first * sin + second * cos
    else:
        even, odd = x[..., 0 : hp.n_rot : 2], x[..., 1 : hp.n_rot : 2]
        out[..., 0 : hp.n_rot : 2] = even * cos - odd * sin
        out[..., 1 : hp.n_rot : 2] = even * sin + odd * cos
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, hp: HParams) -> np.ndarray:
    """q [T, n_head, dk], k [T, n_head_kv, dk], v [T, n_head_kv, dv] -> [T, n_head * dv].

    Query head h reads KV head h // (n_head / n_head_kv), as ggml's broadcasting mul_mat does.
    """
    n_tokens = q.shape[0]
    group = hp.n_head // hp.n_head_kv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * hp.attn_scale
    future = np.triu(np.ones((n_tokens, n_tokens), dtype=bool), k=1)
    scores[:, future] = -np.inf
    out = np.einsum("hqk,khd->qhd", softmax(scores), v)
    return out.reshape(n_tokens, hp.n_head * hp.head_dim_v)


class Linear:
    """One projection y = x W^T (+ b), weights dequantized once and shared by every sequence."""

    def __init__(self, model: GgufModel, prefix: str):
        self.weight = model.weight(f"{prefix}.weight")
        self.bias = model.optional(f"{prefix}.bias")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


KV_CACHE_DTYPES = {"f64": np.float64, "f16": np.float16}


def layer_forward(
    model: GgufModel, il: int, hidden: list[np.ndarray], kv_cache: str = "f64"
) -> list[np.ndarray]:
    """One transformer block applied to every sequence's hidden states [T, n_embd].

    `kv_cache` is the precision K and V are stored in before attention reads them: "f64" keeps
    them exact; "f16" rounds them as an f16 KV cache (llama.cpp's default, and Lucebox's) does,
    so that a comparison measures the computation rather than the cache's storage precision.
    """
    stored = KV_CACHE_DTYPES[kv_cache]
    hp = model.hp
    b = f"blk.{il}"
    attn_norm = model.weight(f"{b}.attn_norm.weight")
    wq, wk, wv = Linear(model, f"{b}.attn_q"), Linear(model, f"{b}.attn_k"), Linear(model, f"{b}.attn_v")
    wo = Linear(model, f"{b}.attn_output")
    q_norm = model.weight(f"{b}.attn_q_norm.weight") if hp.arch == "qwen3" else None
    k_norm = model.weight(f"{b}.attn_k_norm.weight") if hp.arch == "qwen3" else None
    ffn_norm = model.weight(f"{b}.ffn_norm.weight")
    gate, up, down = Linear(model, f"{b}.ffn_gate"), Linear(model, f"{b}.ffn_up"), Linear(model, f"{b}.ffn_down")

    out = []
    for x in hidden:
        n_tokens = x.shape[0]
        positions = np.arange(n_tokens)
        h = rms_norm(x, attn_norm, hp.rms_eps)
        q = wq(h).reshape(n_tokens, hp.n_head, hp.head_dim_k)
        k = wk(h).reshape(n_tokens, hp.n_head_kv, hp.head_dim_k)
        v = wv(h).reshape(n_tokens, hp.n_head_kv, hp.head_dim_v)
        if q_norm is not None:
            q = rms_norm(q, q_norm, hp.rms_eps)
            k = rms_norm(k, k_norm, hp.rms_eps)
        q = rope(q, positions, hp)
        k = rope(k, positions, hp)
        k = k.astype(stored).astype(np.float64)
        v = v.astype(stored).astype(np.float64)
        x = x + wo(causal_attention(q, k, v, hp))
        h = rms_norm(x, ffn_norm, hp.rms_eps)
        x = x + down(silu(gate(h)) * up(h))
        out.append(x)
    return out


def output_logits(model: GgufModel, hidden: list[np.ndarray]) -> list[np.ndarray]:
    """Final RMSNorm and the output projection (tied to token_embd when output.weight is absent)."""
    hp = model.hp
    normed = np.concatenate([rms_norm(x, model.weight("output_norm.weight"), hp.rms_eps) for x in hidden])
    name = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"
    tensor = model.tensors[name]
    logits = np.empty((normed.shape[0], hp.vocab), dtype=np.float64)
    for start in range(0, hp.vocab, OUTPUT_CHUNK_ROWS):
        stop = min(start + OUTPUT_CHUNK_ROWS, hp.vocab)
        chunk = np.asarray(dequantize(tensor.data[start:stop], tensor.tensor_type), dtype=np.float64)
        logits[:, start:stop] = normed @ chunk.T
    bias = model.optional("output.bias")
    if bias is not None:
        logits += bias
    bounds = np.cumsum([0] + [x.shape[0] for x in hidden])
    return [logits[bounds[i] : bounds[i + 1]] for i in range(len(hidden))]


def forward(model: GgufModel, sequences: list[list[int]], kv_cache: str = "f64") -> list[np.ndarray]:
    """Logits [n_tokens, vocab] (float64) at every position of every sequence; `kv_cache` as in
    `layer_forward`."""
    if kv_cache not in KV_CACHE_DTYPES:
        raise ModelError(f"kv cache precision {kv_cache!r} is not one of {sorted(KV_CACHE_DTYPES)}")
    hp = model.hp
    for i, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ModelError(f"sequence {i} is empty")
        bad = [t for t in seq if not 0 <= t < hp.vocab]
        if bad:
            raise ModelError(f"sequence {i}: token id {bad[0]} is outside the vocabulary of {hp.vocab}")

    started = time.perf_counter()
    hidden = [model.rows("token_embd.weight", np.asarray(seq, dtype=np.int64)) for seq in sequences]
    for il in range(hp.n_layer):
        hidden = layer_forward(model, il, hidden, kv_cache)
    layers_done = time.perf_counter()
    logits = output_logits(model, hidden)
    done = time.perf_counter()
    log(
        f"{hp.arch}, {hp.n_layer} layers, {sum(len(s) for s in sequences)} tokens in {len(sequences)} "
        f"sequences: blocks {layers_done - started:.1f} s, output {done - layers_done:.1f} s"
    )
    return logits
