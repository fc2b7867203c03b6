"""SIGTERM and SIGHUP as an exception that unwinds through every ``finally`` (teardown), and
waiting for the user to stop a command.

:class:`Terminated` is a ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception``
swallows it on its way up to the command's exit.

Python runs a signal's handler between any two bytecodes, also inside a weak reference's
callback, a finaliser or a garbage collector's callback, where an exception raised is printed
as "Exception ignored" and dropped (the import machinery's module-lock callbacks are one such
place). A stop signal landing there would be lost and the command would run on to exit 0. So
the stop is delivered again, once the callback has returned, through ``sys.unraisablehook``,
and :func:`stop_received` tells the command's exit that a stop arrived whatever became of it.
Inside a call that must not be cut (:mod:`testbed.stops`), a stop waits until it returns.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time

from testbed import stops

#: the stop signals this module turns into exceptions
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: whether the process started with SIGHUP ignored: ``nohup`` (or ``trap '' HUP``) asked it
#: to outlive its terminal, and it keeps ignoring SIGHUP
HUP_IGNORED_AT_START = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind through every ``finally`` so the fabric is torn
    down."""


_received: list[str] = []  # the stop signals' names, in the order they arrived
_earlier_hook = sys.unraisablehook


def _on_signal(signum, _frame) -> None:
    name = signal.Signals(signum).name
    _received.append(name)
    exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(name)
    if stops.holding():  # inside a library call an exception must not cut (testbed.stops)
        stops.defer(exc)
        return
    raise exc


def _signal_of(exc: BaseException | None, exc_type: type) -> signal.Signals | None:
    """The stop signal an exception stands for, or None for any other exception."""
    if issubclass(exc_type, KeyboardInterrupt):
        return signal.SIGINT
    if issubclass(exc_type, Terminated):
        name = exc.args[0] if exc is not None and exc.args else "SIGTERM"
        return signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGTERM
    return None


#: how long after a stop was dropped it is sent again (time for the callback, and the hook
#: that reported it, to return)
RESEND_DELAY_S = 0.05

_resends: list[signal.Signals] = []
_wake = _thread.allocate_lock()  # released by the hook to wake the resender
_wake.acquire()
_resender: threading.Thread | None = None


def _resend_forever() -> None:
    """The resender's loop: each stop the hook hands over is sent to this process again a
    moment later, from this thread (sent from the main thread, it would be handled at once,
    inside the hook, and dropped there)."""
    while True:
        _wake.acquire()
        time.sleep(RESEND_DELAY_S)
        while _resends:
            os.kill(os.getpid(), _resends.pop(0))


def _on_unraisable(unraisable) -> None:
    """An exception Python had to drop (raised in a callback or a finaliser): a stop's
    exception goes to the resender, to come back as its signal where it can unwind; any
    other goes to the hook installed before."""
    signum = _signal_of(unraisable.exc_value, unraisable.exc_type)
    if signum is None or threading.current_thread() is not threading.main_thread():
        _earlier_hook(unraisable)
        return
    _resends.append(signum)
    try:
        _wake.release()  # one call, the last: nothing of the hook's runs after it
    except RuntimeError:  # the resender is awake already and will see it
        pass


def raise_on_stop_signals() -> None:
    """Turn SIGTERM and SIGHUP (an ssh connection dropping) into :class:`Terminated`, and
    SIGINT into ``KeyboardInterrupt`` even where the shell started us with SIGINT ignored (a
    background job of a non-interactive shell): each tears down like Ctrl-C. SIGHUP stays
    ignored where the process started with it ignored (``nohup``: a run meant to outlive its
    terminal). A stop dropped in a callback is delivered again. From the main thread;
    elsewhere nothing."""
    if threading.current_thread() is threading.main_thread():
        _received.clear()  # a new command: stops sent to an earlier one are its own
        for sig in STOP_SIGNALS:
            if sig != signal.SIGHUP or not HUP_IGNORED_AT_START:
                signal.signal(sig, _on_signal)
        global _resender
        if _resender is None or not _resender.is_alive():
            _resender = threading.Thread(target=_resend_forever, name="stop-resender",
                                         daemon=True)
            _resender.start()
        sys.unraisablehook = _on_unraisable


def stop_received() -> str | None:
    """The name of the first stop signal that arrived since the handlers were installed
    (``SIGHUP``, ...), or None."""
    return _received[0] if _received else None


def wait_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM; returns normally then."""
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        pass
