"""Debian packages a feature needs, installed the first time it is used: the eBPF toolchain
(the ECN marker, link cuts) and the full-kernel guest's tools. ``make run`` installs only what a
fabric on this host needs; these come when an experiment first asks for them, with a line
saying so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from testbed.errors import TestbedError

#: the eBPF toolchain: package -> a file it installs
EBPF_TOOLCHAIN = {"clang": "/usr/bin/clang", "libbpf-dev": "/usr/include/bpf/bpf_helpers.h",
                  "bpftool": "/usr/sbin/bpftool"}
#: what builds and runs the full-kernel guest
GUEST_TOOLS = {"debootstrap": "/usr/sbin/debootstrap",
               "qemu-system-x86": "/usr/bin/qemu-system-x86_64",
               "e2fsprogs": "/usr/sbin/mkfs.ext4"}


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def missing(packages: dict[str, str]) -> list[str]:
    """The packages of ``packages`` (name -> a file it installs) whose file is not there."""
    return [name for name, path in packages.items()
            if not Path(path).exists() and shutil.which(Path(path).name) is None]


def ensure(packages: dict[str, str], why: str,
           log: Callable[[str], None] = _stderr) -> None:
    """Install the missing ones of ``packages`` with apt-get, saying so on ``log`` first.

    Raises:
        TestbedError: not root (the command to run is named), or apt-get failed.
    """
    names = missing(packages)
    if not names:
        return
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *names]
    if os.geteuid() != 0:
        raise TestbedError(f"{why} needs {', '.join(names)}: run as root, or install them: "
                           f"{' '.join(command)}")
    log(f"installing {why} ({', '.join(names)}), once ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                          timeout=1800)
    if proc.returncode != 0:  # an old package index: refresh it once
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env,
                       check=False, timeout=600)
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                              timeout=1800)
    if proc.returncode != 0 or missing(packages):
        raise TestbedError(f"installing {why} failed", " ".join(command),
                           (proc.stdout + proc.stderr)[-2000:])
