"""fabriclab's own os-ken launcher (os-ken 4.x ships no ``osken-manager``).

Usage: ``python -m controllers.launcher --topology T.json --status S.json --port 6653``.
Listens for OpenFlow 1.5 on 127.0.0.1 only, on native threads (no eventlet monkey-patching).
``--user-app FILE`` runs a user's os-ken app instead of fabriclab's, with the topology's path in
``FABRICLAB_TOPOLOGY`` and os-ken's LLDP link discovery on (``--observe-links``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

from controllers.serialtls import SerialTLS
from testbed.model.spec import (
    ControllerSpec,
    EcmpSeed,
    EcmpSelection,
    Granularity,
    Load,
    Routing,
    SprayWeights,
)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, configure os-ken and run the fabric controller until signalled."""
    parser = argparse.ArgumentParser(prog="fabriclab-controller")
    parser.add_argument("--topology", required=True, help="intended topology (JSON)")
    parser.add_argument("--status", required=True, help="status file the app keeps current")
    defaults = ControllerSpec()
    parser.add_argument("--routing", type=Routing, choices=list(Routing),
                        default=defaults.routing)
    parser.add_argument("--ecmp-seed", type=EcmpSeed, choices=list(EcmpSeed),
                        default=defaults.ecmp_seed)
    parser.add_argument("--ecmp-selection", type=EcmpSelection, choices=list(EcmpSelection),
                        default=defaults.ecmp_selection)
    parser.add_argument("--spray-weights", type=SprayWeights, choices=list(SprayWeights),
                        default=defaults.spray_weights)
    parser.add_argument("--poll-interval-s", type=float, default=defaults.poll_interval_s,
                        help="adaptive: the statistics interval")
    parser.add_argument("--granularity", type=Granularity, choices=list(Granularity),
                        default=defaults.granularity, help="local_adaptive: flowlet or packet")
    parser.add_argument("--flowlet-gap-us", type=float, default=defaults.flowlet_gap_us,
                        help="local_adaptive flowlets' idle gap, us")
    parser.add_argument("--load", type=Load, choices=list(Load), default=defaults.load,
                        help="local_adaptive: what a switch weighs (its ports, the next switch)")
    parser.add_argument("--rebalance", type=_percentages,
                        default=",".join(map(str, defaults.rebalance)),
                        help="flowlets' rebalancing: quality delta,chance %% (0,0: off)")
    parser.add_argument("--warm-start", action="store_true",
                        help="read each switch's tables back and change only what differs "
                             "(a restart: the switches kept forwarding on what is installed)")
    parser.add_argument("--port", type=int, required=True,
                        help="OpenFlow port (0: one from the OS, written to --port-file once "
                             "listening: no other process can take it in between)")
    parser.add_argument("--port-file", help="where the listening port is written")
    parser.add_argument("--listen-fd", type=int,
                        help="a listening socket inherited from the fabric (TCP, or a unix "
                             "socket in the run's directory), served instead of binding one: "
                             "it stays open across restarts, so no other process can take "
                             "the port in between")
    parser.add_argument("--tls-dir", help="OpenFlow over TLS with the run's certificates "
                                          "(testbed.linux.pki): switches must present one")
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="the controller's exporter's port (a restart: its predecessor's, "
                             "so that Prometheus's target stays; 0: one from the OS)")
    parser.add_argument("--log", help="log file (default: stderr)")
    parser.add_argument("--app", default="controllers.app", help="os-ken app module")
    parser.add_argument("--user-app", help="a user's os-ken app (a Python file) run instead "
                                           "of --app, with LLDP link discovery on")
    args = parser.parse_args(argv)

    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # app_manager must be imported before controller.controller (circular import otherwise).
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import controller  # noqa: F401 - registers the ofp-* options

    settings = {"topology": args.topology, "status": args.status, "routing": args.routing,
                "ecmp_seed": args.ecmp_seed, "ecmp_selection": args.ecmp_selection,
                "spray_weights": args.spray_weights, "poll_interval_s": args.poll_interval_s,
                "warm_start": "1" if args.warm_start else "", "granularity": args.granularity,
                "flowlet_gap_us": args.flowlet_gap_us, "load": args.load,
                "rebalance": ",".join(map(str, args.rebalance)),
                "metrics_port": args.metrics_port}
    cfg.CONF.register_opts([cfg.StrOpt(name) for name in settings], group="fabriclab")
    cfg.CONF(args=_os_ken_args(args), project="os_ken")
    for name, value in settings.items():
        cfg.CONF.set_override(name, str(value), group="fabriclab")

    def _stop(signum, _frame):
        # os-ken's native threads cannot be unwound by SystemExit from a handler; the app keeps
        # no state that needs flushing beyond the log (its status file is written atomically).
        logging.getLogger("fabriclab.controller").info("signal %d: exiting", signum)
        logging.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, _stop)
    _mended(controller.Datapath)
    _listen_and_say(controller, args.port == 0, args.port_file, args.listen_fd)
    app_manager.AppManager.run_apps([args.user_app or args.app])
    return 0


def _percentages(text: str) -> tuple[int, int]:
    """``DELTA,CHANCE``: two whole percentages (0,0: off)."""
    try:
        delta, chance = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not DELTA,CHANCE (25,25)") from None
    if (delta, chance) != (0, 0) and not (1 <= delta <= 100 and 1 <= chance <= 100):
        raise argparse.ArgumentTypeError(f"{text!r}: each a percentage, 1-100 (or 0,0: off)")
    return delta, chance


def _os_ken_args(args: argparse.Namespace) -> list[str]:
    """os-ken's own options: where it listens (TCP or TLS), and for a user's app the LLDP
    discovery (``--observe-links``, as ryu-manager takes it; the topology's path in
    ``FABRICLAB_TOPOLOGY``)."""
    # a placeholder port for os-ken when the OS chooses (its 0 means "the defaults", 6653 and
    # 6633); the listening socket binds port 0 (_listen_and_say)
    port = str(args.port or 6653)
    listen = ["--ofp-listen-host", args.host]
    if args.tls_dir:
        tls = Path(args.tls_dir)
        listen += ["--ofp-ssl-listen-port", port, "--ctl-privkey",
                   str(tls / "controller-key.pem"), "--ctl-cert",
                   str(tls / "controller-cert.pem"), "--ca-certs", str(tls / "ca.pem")]
    else:
        listen += ["--ofp-tcp-listen-port", port]
    if args.user_app:
        importlib.import_module("os_ken.topology.switches")  # registers --observe-links
        listen += ["--observe-links"]
        os.environ["FABRICLAB_TOPOLOGY"] = str(Path(args.topology).resolve())
    return listen


def _listen_and_say(controller_module, any_port: bool, port_file: str | None,
                    listen_fd: int | None = None) -> None:
    """os-ken's server socket: the one inherited as ``listen_fd``, or one bound to a port of
    the OS's choosing when ``any_port``; its port (0 for a unix socket) is written to
    ``port_file`` once listening. A port chosen free first and bound later left a window for
    another process; an inherited socket leaves none, even between two controllers."""
    from os_ken.lib import hub

    base = controller_module.StreamServer
    inherited = socket.socket(fileno=listen_fd) if listen_fd is not None else None

    class Server(base):
        def __init__(self, listen_info, *a, **kw):
            if any_port:
                listen_info = (listen_info[0], 0)
            own_listen = hub.listen
            if inherited is not None:  # os-ken's constructor calls hub.listen: hand it ours
                hub.listen = lambda *_a, **_kw: inherited
            try:
                super().__init__(listen_info, *a, **kw)
            finally:
                hub.listen = own_listen
            if self.server.family == socket.AF_UNIX:  # os-ken sets TCP_NODELAY on each
                handle = self.handle
                self.handle = lambda sock, addr: handle(_UnixSocket(fileno=sock.detach()),
                                                        addr or "unix")
            if port_file:
                name = self.server.getsockname()
                tmp = f"{port_file}.tmp"
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(str(name[1] if isinstance(name, tuple) else 0))
                os.replace(tmp, port_file)

    controller_module.StreamServer = Server


class _UnixSocket(socket.socket):
    """A switch's connection over a unix socket: TCP's options are no error on it (os-ken
    sets TCP_NODELAY on every connection)."""

    def setsockopt(self, level, *args):
        if level != socket.IPPROTO_TCP:
            super().setsockopt(level, *args)


def _mended(datapath_class) -> None:
    """os-ken's switch connection as fabriclab runs it: its end announced at once, its TLS
    used one operation at a time."""
    _dead_when_the_connection_ends(datapath_class)
    _one_tls_operation_at_a_time(datapath_class)


def _dead_when_the_connection_ends(datapath_class) -> None:
    """Announce a switch's end (``DEAD_DISPATCHER``) as soon as its connection ends.

    On native threads ``hub.kill`` is a no-op, so after a switch's socket reaches EOF os-ken's
    ``Datapath.serve`` waits for its send and echo threads, which end only when something next
    wakes them, before the datapath is closed and the state change announced: 0.5 s and more
    measured after a switch's vswitchd was killed, for a failure the controller routes around.
    """
    receive = datapath_class._recv_loop

    def _recv_loop(self) -> None:
        try:
            receive(self)
        finally:
            self.close()  # DEAD_DISPATCHER now (idempotent; serve()'s own close comes later)
            self.send(b"", close_socket=True)  # wakes the send thread, which then ends

    datapath_class._recv_loop = _recv_loop


def _one_tls_operation_at_a_time(datapath_class) -> None:
    """A switch's TLS connection used by os-ken's receive and send threads one operation at a
    time (:class:`controllers.serialtls.SerialTLS`): at the same moment they corrupt it."""
    construct = datapath_class.__init__

    def __init__(self, sock, address, *args, **kwargs) -> None:
        construct(self, sock, address, *args, **kwargs)
        if isinstance(self.socket, ssl.SSLSocket):
            self.socket = SerialTLS(self.socket)

    datapath_class.__init__ = __init__


if __name__ == "__main__":
    sys.exit(main())
