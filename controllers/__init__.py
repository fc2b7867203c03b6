"""The SDN controller: an os-ken app (:mod:`controllers.app`, its own process started by
:mod:`controllers.launcher`) as a thin shim over pure routing logic (:mod:`controllers.routing`:
tables, policy, adaptive placement, session state). Imports :mod:`testbed`'s model and spec and
:mod:`telemetry`'s metric definitions only.
"""
