"""The compiled transport engine: the RoCEv2-like and UET-like state machines of
:mod:`traffic.transports` in C (``src/``), built from source when fabriclab is installed
(setup.py), with the Python modules as their specification and fallback.

:data:`engine` is the extension module, or None where it was not built (no C compiler, no
Python headers); :data:`WHY_NOT` then says why, in one line.
"""

from __future__ import annotations

try:
    from traffic.native import _engine as engine
    WHY_NOT = ""
except ImportError as err:  # not built here: the Python engine runs
    engine = None
    WHY_NOT = (f"the compiled transport engine is not built ({err}; reinstall fabriclab "
               "with a C compiler and python3-dev: pip install -e .)")


def available() -> bool:
    return engine is not None
