"""Packages installed on first need (testbed/linux/packages.py): nothing when present, a clear
error naming the command without root, one line saying what is installed with it."""

from __future__ import annotations

import subprocess

import pytest

from testbed.errors import TestbedError
from testbed.linux import packages


def test_present_packages_install_nothing(tmp_path, monkeypatch):
    there = tmp_path / "tool"
    there.write_text("")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("apt-get ran"))
    packages.ensure({"tool": str(there)}, "a tool", log=lambda line: pytest.fail(line))


def test_without_root_the_error_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(packages.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match=r"the eBPF toolchain needs fabriclab-none-1: run as "
                                           r"root, or install them: apt-get install .*"
                                           r"fabriclab-none-1"):
        packages.ensure({"fabriclab-none-1": str(tmp_path / "absent")}, "the eBPF toolchain")


def test_as_root_one_line_says_what_is_installed(tmp_path, monkeypatch):
    target = tmp_path / "bin" / "tool"
    ran, said = [], []

    def apt(argv, **_kw):
        ran.append(argv)
        if argv[:2] == ["apt-get", "install"]:
            target.parent.mkdir(exist_ok=True)
            target.write_text("")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(packages.os, "geteuid", lambda: 0)
    monkeypatch.setattr(packages.subprocess, "run", apt)
    packages.ensure({"fabriclab-tool": str(target)}, "the guest's tools", log=said.append)
    assert said == ["installing the guest's tools (fabriclab-tool), once ..."]
    assert ran == [["apt-get", "install", "-y", "-q", "--no-install-recommends",
                    "fabriclab-tool"]]


def test_a_failed_install_is_an_error_with_apt_gets_words(tmp_path, monkeypatch):
    monkeypatch.setattr(packages.os, "geteuid", lambda: 0)
    monkeypatch.setattr(packages.subprocess, "run", lambda argv, **_kw: subprocess.CompletedProcess(
        argv, 100, "", "E: Unable to locate package fabriclab-none-2"))
    with pytest.raises(TestbedError) as err:
        packages.ensure({"fabriclab-none-2": str(tmp_path / "absent")}, "x", log=lambda _l: None)
    assert "Unable to locate package" in err.value.stderr
