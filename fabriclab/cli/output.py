"""What every command shares: its exit codes, its console and its one JSON document.

Every command that reports something takes ``--json``: stdout then carries exactly one JSON
document (what benchmarks and tests read) and the human output goes to stderr. Errors go to
stderr always, so that stdout holds only what the command produces.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console

EXIT_OK = 0
EXIT_UNREACHABLE = 1  # up --check: a pair of hosts did not reach each other
EXIT_CONFIG = 2  # a bad experiment file or option (the field named)
EXIT_SYSTEM = 3  # a system step failed, or a run, variant or cell did
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (torn down)


def console(to_stderr: bool) -> Console:
    """The human output: stderr under ``--json``; wide and uncoloured in logs."""
    out = Console(stderr=to_stderr, highlight=False, soft_wrap=True)  # logs stay grep-able
    if not out.is_terminal:
        out.width = max(out.width, 120)  # tables in logs and CI output stay whole
    return out


def error_console() -> Console:
    """Where errors go, whatever the command prints on stdout (a document, a table, DOT)."""
    return console(to_stderr=True)


def emit(doc: object) -> None:
    """The one JSON document of a ``--json`` command, on stdout."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
