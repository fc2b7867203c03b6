"""A round trip measured from inside a host with no server at the other end: a TCP connection
to a port nobody listens on is refused by the peer's kernel with a reset, one round trip after
the SYN left (both through the fabric, its queues and any delay line). The least of several
tries is the unloaded round trip.

Run in a host as ``python -m testbed.linux.rttprobe ADDRESS [COUNT] [PORT]``; prints
``{"rtts_s": [...], "errors": [...]}`` as one JSON line.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
import time

CLOSED_PORT = 1  # tcpmux: nothing of the fabric's listens there
TIMEOUT_S = 30.0
GAP_S = 0.05


def refused_rtt(address: str, port: int = CLOSED_PORT, timeout_s: float = TIMEOUT_S) -> float:
    """Seconds from a SYN to the peer's reset. Raises OSError when the connection is not
    refused (accepted, timed out, unreachable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        start = time.monotonic()
        code = sock.connect_ex((address, port))
        took = time.monotonic() - start
    if code != errno.ECONNREFUSED:
        raise OSError(code, f"{address}:{port}: {errno.errorcode.get(code, code)} "
                            "(a refusal was expected)")
    return took


def main(argv: list[str]) -> int:
    address = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 5
    port = int(argv[2]) if len(argv) > 2 else CLOSED_PORT
    rtts, errors = [], []
    for _ in range(count):
        try:
            rtts.append(refused_rtt(address, port))
        except OSError as err:
            errors.append(str(err))
        time.sleep(GAP_S)
    print(json.dumps({"rtts_s": rtts, "errors": errors}))
    return 0 if rtts else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
