"""The SDN controller: an os-ken app (:mod:`controllers.app`, its own process started by
:mod:`controllers.launcher`) as a thin shim over pure routing policy (:mod:`controllers.routing.policy`)
and session state (:mod:`controllers.routing.session`). Imports :mod:`testbed`'s model and spec only.
"""
