"""Named network namespaces: a fabric's hosts under their own names in ``/run/netns``, so that
``ip netns exec h1_1_1 ...`` (and every tool that reads ``/run/netns``) reaches them while the
fabric is up. A name is a bind mount of the host shell's ``/proc/PID/ns/net``; removing it
(unmount, unlink) leaves the namespace to its processes, which end with the fabric.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from pyroute2 import netns as pyroute2_netns

from testbed.errors import TestbedError

RUN_DIR = Path(pyroute2_netns.NETNS_RUN_DIR)


def named() -> set[str]:
    """The names ``ip netns list`` shows."""
    return set(pyroute2_netns.listnetns()) if RUN_DIR.is_dir() else set()


class NameTaken(TestbedError):
    """The name is someone else's (found taken, or taken between the look and the naming)."""


def name(netns_name: str, pid: int) -> None:
    """Give the network namespace of process ``pid`` the name ``netns_name``. The name's file
    is made exclusively, so of two fabrics naming the same host at once (two machines of a
    cluster sharing one ``/run/netns``) exactly one gets it.

    Raises:
        NameTaken: the name is taken.
        TestbedError: the bind mount failed.
    """
    if netns_name in named():
        raise NameTaken(f"network namespace name {netns_name!r} is taken")
    try:
        pyroute2_netns.attach(netns_name, pid)
    except OSError as err:
        if err.errno == errno.EEXIST:
            raise NameTaken(f"network namespace name {netns_name!r} is taken") from err
        raise TestbedError(f"naming the namespace of pid {pid} {netns_name!r}: {err}") from err
    if not (RUN_DIR / netns_name).exists():
        raise TestbedError(f"naming the namespace of pid {pid} {netns_name!r}: "
                           f"{RUN_DIR / netns_name} was not made")


def inode(netns_name: str) -> int | None:
    """The namespace a name stands for (its nsfs inode); 0 when the name stands for none
    here (its file is not a namespace: the mount is gone, or in another mount namespace);
    None when there is no such name."""
    try:
        st = os.stat(RUN_DIR / netns_name)
        nsfs = os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return None
    return st.st_ino if st.st_dev == nsfs else 0


def process_inode(pid: int) -> int | None:
    """The network namespace of process ``pid`` (its nsfs inode), None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def unname(netns_name: str) -> bool:
    """Remove the name ``netns_name`` (nothing when it is gone already).

    Returns:
        Whether there was one.

    Raises:
        TestbedError: the name stays (a mount that cannot be undone).
    """
    path = RUN_DIR / netns_name
    if not path.exists():
        return False
    try:
        pyroute2_netns.remove(netns_name)
    except OSError as err:
        raise TestbedError(f"removing network namespace name {netns_name!r}: {err}") from err
    if os.path.lexists(path):
        raise TestbedError(f"removing network namespace name {netns_name!r}: {path} stays")
    return True
