"""A host NIC's acknowledgements first: the plan, the classic-BPF filter run on frames, and
the netlink request that installs it."""

import struct
from pathlib import Path

import yaml

from fabriclab.model import experiment as xp
from testbed.linux.rawnl import TCA_BPF_OPS, cbpf_filter_request
from testbed.plan.portplan import link_plan, scale_up_plan
from testbed.plan.tcplan import ACK_MAX_BYTES, TCP_ACK_FILTER, plan_shaping


def run_cbpf(program, frame: bytes) -> int:
    """The classic BPF instructions the filter uses, run on one frame (A register only)."""
    a, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == 0x28:  # ldh [k]
            a = struct.unpack_from("!H", frame, k)[0]
        elif code == 0x30:  # ldb [k]
            a = frame[k]
        elif code == 0x80:  # ld len
            a = len(frame)
        elif code == 0x15:  # jeq #k
            pc += jt if a == k else jf
        elif code == 0x25:  # jgt #k
            pc += jt if a > k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"opcode {code:#x} not expected")


def frame(ethertype: int = 0x0800, proto: int = 6, payload: int = 0) -> bytes:
    ip = bytes(9) + bytes([proto]) + bytes(10)
    tcp = bytes(32)  # with the timestamp option: a pure ACK's header
    return bytes(12) + struct.pack("!H", ethertype) + ip + tcp + bytes(payload)


def test_the_filter_matches_tcp_acknowledgements_only():
    assert run_cbpf(TCP_ACK_FILTER, frame()) == 0xFFFFFFFF  # a pure ACK, 66 bytes
    assert run_cbpf(TCP_ACK_FILTER, frame(payload=ACK_MAX_BYTES - 66)) == 0xFFFFFFFF
    assert run_cbpf(TCP_ACK_FILTER, frame(payload=ACK_MAX_BYTES - 65)) == 0  # one byte more
    assert run_cbpf(TCP_ACK_FILTER, frame(payload=8948)) == 0  # a jumbo data frame
    assert run_cbpf(TCP_ACK_FILTER, frame(proto=17)) == 0  # UDP: the transports' own
    assert run_cbpf(TCP_ACK_FILTER, frame(ethertype=0x0806)) == 0  # ARP


def test_the_request_carries_the_program_and_the_class():
    req = cbpf_filter_request(7, 0x10000, 1, 0x10020, TCP_ACK_FILTER)
    length, kind = struct.unpack_from("=IH", req)
    assert length == len(req) and kind == 44  # RTM_NEWTFILTER
    _family, ifindex, _handle, parent, info = struct.unpack_from("=BxxxiIII", req, 16)
    assert (ifindex, parent, info >> 16) == (7, 0x10000, 1)
    ops = b"".join(struct.pack("=HBBI", *i) for i in TCP_ACK_FILTER)
    assert struct.pack("=HH", 4 + len(ops), TCA_BPF_OPS) + ops in req


def test_a_fabric_plans_acknowledgements_first_at_nics_and_gpus_and_switches_when_asked():
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments"
                          / "rails.yaml").read_text())
    raw.pop("variants")
    raw["fabric"]["queue"].pop("acks_first", None)
    spec = xp.parse(raw)
    link = next(l for l in spec.topology.links if l.tier == "host")
    assert link_plan(spec, link, host_end=True).acks_first
    assert not link_plan(spec, link).acks_first  # the switch's port: one FIFO by default
    up = spec.topology.scale_up[0]
    assert scale_up_plan(spec, up, gpu_end=True).acks_first
    assert not scale_up_plan(spec, up).acks_first  # the NVSwitch's (bridge's) port
    raw["fabric"]["queue"]["acks_first"] = True
    spec = xp.parse(raw)
    assert link_plan(spec, link).acks_first and scale_up_plan(spec, up).acks_first
    assert not link_plan(spec, link, red_marking=True).acks_first  # RED leaves: one class


def test_host_nics_of_one_class_send_acknowledgements_first():
    plain = plan_shaping(100, 9000, 2048)
    assert not plain.acks_first  # switch ports: as a switch's queue is
    host = plan_shaping(100, 9000, 2048, acks_first=True)
    assert host.acks_first and not host.classes
    assert host.ack_rate_kbit == 1000 and host.queue_limit == 2048 * 1024
    assert not plan_shaping(100, 9000, 2048, delay_us=50, acks_first=True).acks_first
    classes = plan_shaping(100, 9000, 2048, priorities=(0, 3), acks_first=True)
    assert classes.classes  # several classes: acknowledgements go with their own class
    assert plan_shaping(1, 1500, 64, acks_first=True).ack_rate_kbit == 10
