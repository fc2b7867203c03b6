"""Host namespace names in /run/netns: two fabrics naming one host at once (two machines of a
cluster sharing this host's /run/netns) end with one owner and one "taken", never an error."""

import os

import pytest

from testbed.linux import netns
from tests.privileges import needs_root


@needs_root("a namespace name is a bind mount under /run/netns")
def test_a_name_taken_between_the_look_and_the_naming_is_taken_not_a_failure(monkeypatch):
    name = f"fltest-{os.getpid()}"
    netns.name(name, os.getpid())
    try:
        with pytest.raises(netns.NameTaken, match=f"{name}' is taken"):
            netns.name(name, os.getpid())  # seen taken
        monkeypatch.setattr(netns, "named", set)  # the look saw it free: the race
        with pytest.raises(netns.NameTaken, match=f"{name}' is taken"):
            netns.name(name, os.getpid())
        assert (netns.RUN_DIR / name).exists()  # the first owner's name stands
    finally:
        assert netns.unname(name)
    assert not netns.unname(name)
