"""Copying a GGUF's metadata into a GGUFWriter (shared by the tools that derive test models)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gguf import GGUFReader, GGUFValueType


def metadata_items(reader: GGUFReader) -> Iterator[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """(key, value, type, array element type) of every stored key.

    Leaves out the reader's GGUF.* header pseudo-keys and general.architecture, which GGUFWriter
    writes itself from its `arch` argument.
    """
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        yield field.name, field.contents(), vtype, sub_type
