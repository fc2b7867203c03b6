"""fabriclab from Python: build a fabric, work inside it, break a link, then run the
experiment and read its results, typed (as root: ``.venv/bin/python examples/api_tour.py``).

Prints what it saw and exits 0 when every step behaved; the project's tests run it.
"""

import sys
import tempfile
from pathlib import Path

import fabriclab

HERE = Path(__file__).resolve().parent


def main() -> int:
    exp = fabriclab.load(HERE / "small.yaml")
    print(f"{exp.name}: {len(exp.topology.hosts)} hosts, {len(exp.topology.switches)} switches")
    with fabriclab.up(exp) as fabric:
        first, last = fabric.hosts[0], fabric.hosts[-1]
        ping = fabric.exec(first, ["fping", "-c1", "-t", "2000", fabric.ip(last)])
        print(f"{first} -> {last}: exit {ping.returncode}")
        reach = fabric.check()
        print(f"all pairs: {reach.ok}/{reach.pairs} reachable")
        fabric.fail("leaf1", "spine1")  # the controller routes around it
        after = fabric.check()
        print(f"leaf1-spine1 down: {after.ok}/{after.pairs} reachable")
        fabric.restore("leaf1", "spine1")
        if ping.returncode != 0 or not reach.complete or not after.complete:
            return 1
    with tempfile.TemporaryDirectory() as out:
        results = fabriclab.run(exp, out=Path(out) / "small")
        for c in results.collectives:
            print(f"{c.op} {c.bytes} B on {len(c.ranks)} ranks: {c.time_us:.0f} us, "
                  f"algbw {c.algbw_GBps:.4g} GB/s, busbw {c.busbw_GBps:.4g} GB/s, "
                  f"efficiency {c.efficiency:.2f}")
        return 0 if results.complete and len(results.collectives) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
