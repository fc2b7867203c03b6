"""fabriclab's pytest plugin: integration tests of your own against a live fabric, as
fabriclab's tests do. Installed with fabriclab (the ``pytest11`` entry point), so any test
can ask for the ``fabric`` fixture:

    import pytest

    @pytest.mark.fabriclab("experiments/quickstart.yaml")
    def test_every_pair_reachable(fabric):
        assert fabric.check().complete

The fixture builds the experiment's fabric before the test (:func:`fabriclab.up`: a
:class:`fabriclab.api.Fabric`, with ``exec``, ``check``, ``fail``, ``restore``, ``hosts``,
``ip``) and tears it down after it, whatever the test did. The experiment file comes from the
test's ``fabriclab`` marker, else ``--fabriclab-experiment FILE``, else the ini option
``fabriclab_experiment``; a relative path is taken from pytest's root directory. A fabric
needs root: without it the test is skipped, saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MARKER = "fabriclab"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("fabriclab", "live fabrics (the fabric fixture)")
    group.addoption("--fabriclab-experiment", metavar="FILE", default=None,
                    help="the experiment file the fabric fixture builds when a test's "
                         "fabriclab marker names none")
    group.addoption("--fabriclab-state-dir", metavar="DIR", default=None,
                    help="run records and caches (default fabriclab's, /run/fabriclab)")
    parser.addini("fabriclab_experiment", "the experiment file the fabric fixture builds "
                                          "when a test names none", default="")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(path): the experiment file the fabric "
                                       "fixture builds for this test")


def experiment_path(request) -> Path:
    """The experiment file a test's ``fabric`` fixture builds (see the module's text)."""
    marker = request.node.get_closest_marker(MARKER)
    named = (marker.args[0] if marker is not None and marker.args else
             request.config.getoption("fabriclab_experiment")
             or request.config.getini("fabriclab_experiment"))
    if not named:
        raise pytest.UsageError(f"{request.node.nodeid}: the fabric fixture needs an "
                                f"experiment file: @pytest.mark.{MARKER}('FILE'), "
                                "--fabriclab-experiment FILE or the fabriclab_experiment ini "
                                "option")
    path = Path(named)
    return path if path.is_absolute() else Path(request.config.rootpath) / path


@pytest.fixture
def fabric(request):
    """A live fabric built from the test's experiment file, torn down after the test."""
    path = experiment_path(request)
    if os.geteuid() != 0:
        pytest.skip("a live fabric needs root (network namespaces, Open vSwitch)")
    from fabriclab import api  # the testbed only where a fabric is asked for
    from testbed.paths import DEFAULT_STATE_DIR

    state = request.config.getoption("fabriclab_state_dir") or DEFAULT_STATE_DIR
    with api.up(path, state_dir=state) as live:
        yield live
