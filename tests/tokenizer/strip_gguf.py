#!/usr/bin/env python3
"""Copies a GGUF file's metadata, without its tensors, to a new GGUF file.

The tokenizer fixtures are made on a machine that receives the working tree, and the model files
are far too large to send; a metadata-only copy holds everything a tokenizer or chat template
reads (a few MB).

    python3 tests/tokenizer/strip_gguf.py MODEL.gguf OUT.gguf
"""
import sys

import gguf


def strip(source: str, destination: str) -> None:
    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(destination, architecture)
    for key, field in reader.fields.items():
        # The header's own fields and the architecture (which the writer adds itself) are not kv pairs to copy.
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), main_type, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    strip(sys.argv[1], sys.argv[2])
