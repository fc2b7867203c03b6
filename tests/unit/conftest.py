"""Unit tests keep the machine's state as it was: the index of state directories a run was
recorded in (testbed.runs.registry.STATE_DIR_INDEX) is a test's own."""

import pytest

from testbed.runs import registry


@pytest.fixture(autouse=True)
def _own_state_dir_index(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR_INDEX",
                        tmp_path_factory.mktemp("index") / "state-dirs")
