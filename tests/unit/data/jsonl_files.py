"""Small JSONL files for the data tests: one JSON object per sample, ``{"id": n, "tokens": [...]}``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def sample(ident: int, length: int) -> dict:
    return {"id": ident, "tokens": [ident % 97] * length}


def write_jsonl(path: Path, ids: range | list[int], *, lengths=None, blank_every: int = 0,
                trailing_newline: bool = True, packed: bool = False) -> Path:
    """Write one line per id (``lengths[i]`` tokens), a blank line after every ``blank_every``-th."""
    lines = []
    for position, ident in enumerate(ids):
        length = lengths[position] if lengths is not None else ident % 13
        lines.append(json.dumps(sample(ident, length)))
        if blank_every and position % blank_every == blank_every - 1:
            lines.append("")
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    if packed:
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
