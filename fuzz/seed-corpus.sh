#!/bin/sh
# Writes the seed corpus of the gguf_parse target (fuzz/corpus/gguf_parse, ignored by git):
# small metadata-only, tiny-tensor and truncated copies of the fetched models, and a synthetic
# file with every metadata type. Models come from the same directory the tests use.
set -eu
cd "$(dirname "$0")/.."
models="${LUCEBOX_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lucebox/models}"
set -- "$models"/*.gguf
[ -e "$1" ] || { echo "no models in $models: run tests/run-all or lucebox fetch first" >&2; exit 1; }
cargo run --quiet --release -p lucebox-gguf --example fuzz-seeds -- fuzz/corpus/gguf_parse "$@"
