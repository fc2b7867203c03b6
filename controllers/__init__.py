"""The SDN controller: an os-ken app (:mod:`controllers.app`, its own process started by
:mod:`controllers.launcher`) as a thin shim over pure routing policy (:mod:`controllers.policy`)
and session state (:mod:`controllers.session`). Imports :mod:`testbed`'s model and spec only.
"""
