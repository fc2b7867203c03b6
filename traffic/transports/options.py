"""A UDP transport's settings beyond its kind, as an experiment file gives them
(``transport: {kind: uet, rccc: true, nscc: false, delivery: rod, entropy: bitmap}``) and as
the agents carry them: uet's receiver credits, its NSCC window, its delivery mode and its
choice of entropy; rocev2's congestion control; for both, the engine that runs them (the
compiled one, or the Python reference)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from traffic.transports.entropy import ENTROPY_CHOICES
from traffic.transports.uet_control import DELIVERY_MODES

__all__ = ["DELIVERY_MODES", "ENGINES", "ENTROPY_CHOICES", "PER_KIND", "ROCE_CONGESTION_CONTROLS",
           "TransportOptions"]

#: rocev2's congestion controls: DCQCN (its profile from ``dcqcn``), HPCC (INT), Swift (delay)
ROCE_CONGESTION_CONTROLS = ("dcqcn", "hpcc", "swift")
#: the engines that run the UDP transports: the compiled one (traffic/native), the Python one
ENGINES = ("native", "python")
#: the settings each transport takes (besides ``kind``, ``spray`` and, for rocev2, ``dcqcn``)
PER_KIND = {"uet": ("rccc", "nscc", "delivery", "entropy", "engine"),
            "rocev2": ("congestion_control", "engine"), "tcp": ()}


@dataclass(frozen=True)
class TransportOptions:
    """Defaults: uet reliable unordered with NSCC, REPS and no receiver credits; rocev2 with
    DCQCN."""

    rccc: bool = False
    nscc: bool = True
    delivery: str = "rud"
    entropy: str = "reps"
    congestion_control: str = "dcqcn"
    engine: str = "native"  # the compiled engine where it is built, else the Python one

    def __post_init__(self) -> None:
        if self.delivery not in DELIVERY_MODES:
            raise ValueError(f"delivery {self.delivery!r}: one of {', '.join(DELIVERY_MODES)}")
        if self.entropy not in ENTROPY_CHOICES:
            raise ValueError(f"entropy {self.entropy!r}: one of {', '.join(ENTROPY_CHOICES)}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r}: one of {', '.join(ENGINES)}")
        if self.congestion_control not in ROCE_CONGESTION_CONTROLS:
            raise ValueError(f"congestion_control {self.congestion_control!r}: one of "
                             f"{', '.join(ROCE_CONGESTION_CONTROLS)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> TransportOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})
