#!/usr/bin/env python3
"""Makes the Hugging Face reference fixtures for lucebox-tokenizer's tests.

For each GGUF file given (metadata-only copies made by strip_gguf.py are enough) it writes
`<file stem>.hf.json` holding, for every entry of corpus.json:

- `hf`: the ids of `transformers.AutoTokenizer.from_pretrained(dir, gguf_file=...)` with
  `add_special_tokens=False` (special tokens in the text are matched), and `hf_split_special`: the
  same with special tokens treated as plain text;
- `original` / `original_split_special`: the ids of a `tokenizers` pipeline built from the same
  GGUF vocabulary and merges the way the model family's published tokenizer.json is built
  (see ORIGINAL_PIPELINES). transformers' GGUF loader does not rebuild every detail of the
  published tokenizer (SmolLM2's individual digits, Qwen2's added tokens beyond the first three),
  so the tests need both to tell a lucebox bug from a loader simplification;

and, for every entry of conversations.json, `apply_chat_template(..., tokenize=False)`.
Failures are recorded in the output rather than aborting, so one run returns everything.

    python3 tests/tokenizer/make_hf_fixtures.py OUT_DIR MODEL.gguf...
"""
import importlib.metadata
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gguf  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers  # noqa: E402
from tokenizers.models import BPE  # noqa: E402

HERE = Path(__file__).resolve().parent
CONTROL, USER_DEFINED = 3, 4

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen2_pipeline():
    return normalizers.NFC(), pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def smollm_pipeline():
    return None, pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# tokenizer.ggml.pre -> (normalizer, pre-tokenizer) of the published tokenizer.json of that family.
ORIGINAL_PIPELINES = {"qwen2": qwen2_pipeline, "smollm": smollm_pipeline}


def gguf_tokenizer_fields(path):
    reader = gguf.GGUFReader(path)

    def get(key):
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    return {
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
    }


def original_tokenizer(fields):
    normalizer, pre_tokenizer = ORIGINAL_PIPELINES[fields["pre"]]()
    vocab = {token: i for i, token in enumerate(fields["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in fields["merges"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    added = []
    for token, kind in zip(fields["tokens"], fields["token_type"]):
        if kind in (CONTROL, USER_DEFINED):
            added.append(AddedToken(token, special=kind == CONTROL, normalized=False))
    tok.add_tokens(added)
    return tok


def encode_both(backend, text):
    backend.encode_special_tokens = False
    matched = backend.encode(text, add_special_tokens=False).ids
    backend.encode_special_tokens = True
    split = backend.encode(text, add_special_tokens=False).ids
    backend.encode_special_tokens = False
    return matched, split


def attempt(record, key, fn):
    try:
        record[key] = fn()
    except Exception:  # recorded, so that one run returns every result it can
        record[key + "_error"] = traceback.format_exc()


def describe(backend):
    spec = json.loads(backend.to_str())
    spec["model"] = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")}
    return spec


def fixture_for(path, corpus, conversations):
    out = {
        "model": path.stem,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }
    fields = gguf_tokenizer_fields(path)
    hf = None
    try:
        hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        out["hf_class"] = type(hf).__name__
        out["hf_special_tokens"] = {k: str(v) for k, v in hf.special_tokens_map.items()}
        out["hf_pipeline"] = describe(hf.backend_tokenizer)
    except Exception:
        out["hf_load_error"] = traceback.format_exc()
    original = None
    try:
        original = original_tokenizer(fields)
        out["original_pipeline"] = describe(original)
    except Exception:
        out["original_load_error"] = traceback.format_exc()

    encodings = []
    for entry in corpus:
        record = {"name": entry["name"]}
        if hf is not None:
            attempt(record, "hf", lambda: hf.encode(entry["text"], add_special_tokens=False))
            attempt(record, "hf_split_special", lambda: encode_both(hf.backend_tokenizer, entry["text"])[1])
        if original is not None:
            attempt(record, "original", lambda: encode_both(original, entry["text"])[0])
            attempt(record, "original_split_special", lambda: encode_both(original, entry["text"])[1])
        encodings.append(record)
    out["encodings"] = encodings

    chats = []
    for conversation in conversations:
        record = {"name": conversation["name"]}
        if hf is not None:
            attempt(
                record,
                "text",
                lambda: hf.apply_chat_template(
                    conversation["messages"],
                    tokenize=False,
                    add_generation_prompt=conversation["add_generation_prompt"],
                ),
            )
        chats.append(record)
    out["chat"] = chats
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = json.loads((HERE / "corpus.json").read_text(encoding="utf-8"))
    conversations = json.loads((HERE / "conversations.json").read_text(encoding="utf-8"))
    for name in sys.argv[2:]:
        path = Path(name).resolve()
        fixture = fixture_for(path, corpus, conversations)
        target = out_dir / f"{path.stem}.hf.json"
        target.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        errors = [k for k in fixture if k.endswith("_error")]
        errors += [f"{r['name']}:{k}" for r in fixture["encodings"] + fixture["chat"] for k in r if k.endswith("_error")]
        print(f"{target}: {len(fixture['encodings'])} encodings, errors: {errors or 'none'}", flush=True)


if __name__ == "__main__":
    main()
