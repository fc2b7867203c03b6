"""What a test needs beyond an ordinary user, said once: a test that needs a privilege is
marked with it and skips, naming what it lacks, when run without it (``make unit`` runs as any
user)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0


def needs_root(why: str) -> pytest.MarkDecorator:
    """Skip unless run as root; ``why`` names what root is needed for."""
    return pytest.mark.skipif(not IS_ROOT, reason=f"needs root: {why}")


def may_set_congestion_control(name: str) -> bool:
    """Whether this process may give a socket TCP congestion control ``name``: root may
    choose any the kernel has, any other user one in ``tcp_allowed_congestion_control``."""
    if IS_ROOT:
        return True
    try:
        allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    except OSError:
        return False
    return name in allowed
