"""Waiting for a condition with a deadline: the one poll loop every layer uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from testbed.errors import TestbedError

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = 0.05) -> T:
    """Call ``predicate`` until it returns a true value, and return that value.

    Args:
        predicate: checked at once, then every ``interval_s``; exceptions propagate.
        timeout_s: give up after this long.
        what: what is awaited, for the error ("the controller to listen on ...").
        interval_s: pause between checks.

    Raises:
        TestbedError: ``timed out after N s waiting for <what>``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TestbedError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
