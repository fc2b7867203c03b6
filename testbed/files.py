"""Small file helpers shared by every layer: atomic writes (a reader never sees half a file)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    Args:
        path: the file to (re)place.
        text: its new content.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, doc: object, indent: int | None = 1) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(doc, indent=indent))
