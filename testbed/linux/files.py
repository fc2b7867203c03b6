"""Small file helpers shared by every layer: atomic writes (a reader never sees half a file),
and a cached artefact built once (the guest image, the lab's box)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path


def build_once(ready: Callable[[], bool], build: Callable[[], None], cache_dir: Path) -> None:
    """Run ``build`` unless ``ready()``: one builder at a time (a lock file in ``cache_dir``),
    and a process that waited for another's build finds it done and builds nothing."""
    if ready():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready():
            build()


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
