"""SIGTERM as an exception that unwinds through every ``finally`` (teardown), and waiting for
the user to stop a command.

:class:`Terminated` is a ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception``
swallows it on its way up to the command's exit.
"""

from __future__ import annotations

import signal
import threading
import time


class Terminated(BaseException):
    """SIGTERM arrived: unwind through every ``finally`` so the fabric is torn down."""


def _on_sigterm(signum, _frame) -> None:
    raise Terminated(f"signal {signum}")


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (from the main thread; elsewhere nothing)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def wait_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM; returns normally then."""
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        pass
