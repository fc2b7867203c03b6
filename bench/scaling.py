"""Scale invariance as a benchmark: one time-scaled experiment file run at N and at 2N, its
results compared in the real fabric's units.

A time-scaled fabric (``emulator.time_scale``, docs/scaling.md) keeps the real fabric's regime
at any N this machine keeps up with: the same file at N and 2N must give the same real-unit
figures, within noise. For every variant and collective: flow completion p50 and p99 (us of
the real fabric), throughput (the flows' aggregate share of ideal, else busbw in real GB/s),
and over each variant's run the busiest switch port's queue p99 in bandwidth-delay products;
each at both factors and their ratio.

    python bench/scaling.py FILE [--n N] [--variants a,b] [--repeat R] [--out DIR] [--json OUT]

``--n`` (default: the file's ``auto`` on this machine) is the lower factor; the file's own
variants run, or those named; the runs stay in DIR/n and DIR/2n (default
runs/scaling-NAME). With ``--repeat R`` the file runs R times at each factor, N and 2N in
turn (so that the machine's load drifts alike for both), in DIR/n-1, DIR/2n-1, ...; each
figure is the median of its R runs, and the spread (least to most) is shown beside it: a
ratio off 1 by less than the spread at one factor is the runs' noise, not the scaling.
Needs root and what ``make setup`` installs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabriclab.model import experiment as xp  # noqa: E402
from fabriclab.model.document import RunDocument  # noqa: E402
from fabriclab.rundirs import read_document  # noqa: E402

FIGURES = ("fct_p50_us", "fct_p99_us", "throughput", "queue_p99_bdp")


def figures(doc: RunDocument) -> dict[str, dict[str, float]]:
    """Per collective label (first repetition's name), its real-unit figures; ``run`` holds
    the variant's queue p99 in BDPs."""
    out: dict[str, dict[str, float]] = {}
    n = doc.time_scale.n
    for row in doc.collectives:
        fct = row.fct_s if row.fct_s.p50 is not None else row.flow_end_s  # (runs before)
        label = row.name if row.name not in out else f"{row.name}#{row.repetition}"
        out[label] = {"fct_p50_us": (fct.p50 or 0) / n * 1e6,
                      "fct_p99_us": (fct.p99 or 0) / n * 1e6,
                      "throughput": (row.throughput_of_ideal if row.throughput_of_ideal
                                     else row.busbw_GBps * n)}
    ports = doc.congestion.ports if doc.congestion else {}
    q99 = max((p.queue_p99_bytes or 0 for p in ports.values()), default=0)
    out["run"] = {"queue_p99_bdp": q99 / doc.fabric.bdp_bytes if doc.fabric.bdp_bytes else 0}
    return out


def run_at(path: Path, data: dict, n: float, out: Path) -> dict[str, dict]:
    """The file at factor ``n``: per variant (or the base, ``-``), its figures."""
    data = json.loads(json.dumps(data))
    data.setdefault("emulator", {})["time_scale"] = n
    scaled = out.with_suffix(".yaml")
    scaled.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "run", str(scaled), "--out",
                           str(out), "--force"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    print(proc.stdout[-4000:], proc.stderr[-2000:], file=sys.stderr)
    results = {}
    names = [v["name"] for v in data.get("variants", [])] or [None]
    for name in names:
        doc = read_document((out / name if name else out) / "results.json")
        if doc is None or not doc.complete:
            results[name or "-"] = {"error": doc.error if doc else "no results.json"}
            continue
        results[name or "-"] = {"fidelity": doc.fidelity_verdict, **figures(doc)}
    return results


def median_of(runs: list[dict]) -> dict:
    """Per variant and collective, each figure's median over ``runs`` (results of
    :func:`run_at`), with ``<figure>_spread`` (least, most); a variant that failed in every
    run keeps the first error."""
    out: dict = {}
    for variant in runs[0]:
        done = [r[variant] for r in runs if variant in r and "error" not in r[variant]]
        if not done:
            out[variant] = runs[0][variant]
            continue
        merged: dict = {"fidelity": "/".join(str(d.get("fidelity")) for d in done)}
        for label, figs in done[0].items():
            if not isinstance(figs, dict):
                continue
            merged[label] = {}
            for name in figs:
                values = sorted(d[label][name] for d in done if name in d.get(label, {}))
                mid = len(values) // 2
                merged[label][name] = (values[mid] if len(values) % 2 else
                                       (values[mid - 1] + values[mid]) / 2)
                merged[label][f"{name}_spread"] = (values[0], values[-1])
        out[variant] = merged
    return out


def compare(low: dict, high: dict) -> list[dict]:
    """One line per variant, collective and figure: its value at N, at 2N, their ratio."""
    lines = []
    for variant, colls in low.items():
        other = high.get(variant, {})
        for label, figs in colls.items():
            if not isinstance(figs, dict):
                continue
            for name in FIGURES:
                if name in figs and name in other.get(label, {}):
                    a, b = figs[name], other[label][name]
                    line = {"variant": variant, "collective": label, "figure": name,
                            "at_n": round(a, 4), "at_2n": round(b, 4),
                            "ratio": round(b / a, 4) if a else None}
                    for key, side in (("spread_n", figs), ("spread_2n", other[label])):
                        if f"{name}_spread" in side:
                            line[key] = [round(v, 4) for v in side[f"{name}_spread"]]
                    lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--n", type=float, help="the lower factor (default: the file's auto)")
    parser.add_argument("--variants", help="comma-separated variants to run (default: all)")
    parser.add_argument("--out", type=Path, help="where the runs go (default runs/scaling-NAME)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per factor; figures are their medians (default 1)")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    data = yaml.safe_load(args.file.read_text())
    if args.variants:
        keep = set(args.variants.split(","))
        data["variants"] = [v for v in data.get("variants", []) if v["name"] in keep]
    n = args.n or xp.load(args.file).time_scale.n
    out = args.out or ROOT / "runs" / f"scaling-{data.get('name', args.file.stem)}"
    out.mkdir(parents=True, exist_ok=True)
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    if args.repeat == 1:
        low = run_at(args.file, data, n, out / "n")
        high = run_at(args.file, data, 2 * n, out / "2n")
    else:
        lows, highs = [], []
        for i in range(1, args.repeat + 1):
            lows.append(run_at(args.file, data, n, out / f"n-{i}"))
            highs.append(run_at(args.file, data, 2 * n, out / f"2n-{i}"))
        low, high = median_of(lows), median_of(highs)
    lines = compare(low, high)
    print(f"{'variant':14} {'collective':14} {'figure':14} {'at N=' + format(n, ',.0f'):>14} "
          f"{'at 2N':>14} {'2N/N':>7}" + ("  spread at N / at 2N" if args.repeat > 1 else ""))
    for line in lines:
        ratio = "-" if line["ratio"] is None else f"{line['ratio']:.3f}"
        spread = "".join(f"  {a:,.3f}-{b:,.3f}" for a, b in
                         (line[k] for k in ("spread_n", "spread_2n") if k in line))
        print(f"{line['variant']:14} {line['collective']:14} {line['figure']:14} "
              f"{line['at_n']:14,.3f} {line['at_2n']:14,.3f} {ratio:>7}{spread}")
    for variant in low:
        print(f"{variant}: fidelity {low[variant].get('fidelity')} at N, "
              f"{high.get(variant, {}).get('fidelity')} at 2N"
              + (f"; errors: {low[variant].get('error')} / {high.get(variant, {}).get('error')}"
                 if "error" in low[variant] or "error" in high.get(variant, {}) else ""))
    if args.json:
        args.json.write_text(json.dumps({"file": str(args.file), "n": n, "low": low,
                                         "high": high, "compare": lines}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
