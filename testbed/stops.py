"""Stops held off while a library call runs that an exception must not cut short.

A stop (SIGINT, SIGTERM, SIGHUP) becomes an exception wherever the main thread happens to be
(fabriclab/signals.py). Most code unwinds cleanly from any point; a few libraries do not.
pyroute2's netlink calls run an asyncio event loop, whose callbacks catch every exception but
KeyboardInterrupt and SystemExit: a stop raised inside one was dropped, left its IPRoute
broken ("Event loop stopped before Future completed") or hung, and the teardown that needed
that socket failed and left namespaces behind. Such calls run inside :func:`held`; a stop that
arrives meanwhile is kept by :func:`defer` and raised when the outermost call has returned.
Per thread: stops are handled in the main thread, and only its calls hold them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


def holding() -> bool:
    """Whether this thread is inside :func:`held`."""
    return getattr(_local, "depth", 0) > 0


def defer(exc: BaseException) -> None:
    """Keep a stop's exception until the call under way returns (the first one wins)."""
    if getattr(_local, "deferred", None) is None:
        _local.deferred = exc


@contextmanager
def held() -> Iterator[None]:
    """Run the body with stops held off; one that arrived is raised as it ends."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        exc = getattr(_local, "deferred", None)
        if not _local.depth and exc is not None:
            _local.deferred = None
            raise exc


class HeldCalls:
    """An object whose every method call holds stops off until it returns (a pyroute2
    ``IPRoute``'s, whose results are whole tuples, not generators)."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args, **kw):
            with held():
                return attr(*args, **kw)

        return call
