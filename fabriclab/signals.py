"""SIGTERM and SIGHUP as an exception that unwinds through every ``finally`` (teardown), and
waiting for the user to stop a command.

:class:`Terminated` is a ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception``
swallows it on its way up to the command's exit.
"""

from __future__ import annotations

import signal
import threading
import time


class Terminated(BaseException):
    """SIGTERM arrived: unwind through every ``finally`` so the fabric is torn down."""


def _on_signal(signum, _frame) -> None:
    raise Terminated(signal.Signals(signum).name)


def raise_on_stop_signals() -> None:
    """Turn SIGTERM and SIGHUP (an ssh connection dropping) into :class:`Terminated`, and
    SIGINT into ``KeyboardInterrupt`` even where the shell started us with SIGINT ignored (a
    background job of a non-interactive shell): each tears down like Ctrl-C. From the main
    thread; elsewhere nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGHUP, _on_signal)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM; returns normally then."""
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        pass
