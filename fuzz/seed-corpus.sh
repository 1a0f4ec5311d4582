#!/bin/sh
# Writes the seed corpora (fuzz/corpus/, ignored by git). gguf_parse and tokenizer_gguf: small
# metadata-only, tiny-tensor and truncated copies of the fetched models, and a synthetic file with
# every metadata type; models come from the same directory the tests use. tokenizer_text: each
# text of tests/tokenizer/corpus.json behind the selector bytes that pick each vocabulary kind,
# with and without special-token parsing.
set -eu
cd "$(dirname "$0")/.."
models="${LUCEBOX_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lucebox/models}"
set -- "$models"/*.gguf
[ -e "$1" ] || { echo "no models in $models: run tests/run-all or lucebox fetch first" >&2; exit 1; }
for target in gguf_parse tokenizer_gguf; do
    cargo run --quiet --release -p lucebox-gguf --example fuzz-seeds -- "fuzz/corpus/$target" "$@"
done
mkdir -p fuzz/corpus/tokenizer_text
python3 - <<'PY'
import json
for i, entry in enumerate(json.load(open("tests/tokenizer/corpus.json"))):
    for selector in (0, 1, 2, 3, 4, 0x80, 0x84):
        with open(f"fuzz/corpus/tokenizer_text/corpus-{i:02d}-{selector:02x}", "wb") as f:
            f.write(bytes([selector]) + entry["text"].encode())
PY
