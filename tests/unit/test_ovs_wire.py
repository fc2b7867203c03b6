"""Wire formats fabriclab writes or reads by hand: the NTR selection-method group property,
ofproto/trace reports, and the counters of a raw qdisc dump."""

import struct

from controllers.routing.ofmsgs import HashSelection
from testbed.linux.ovs import trace_outputs

TRACE = """Flow: tcp,in_port=1,vlan_tci=0x0000,nw_src=10.1.1.1,nw_dst=10.3.1.1,tp_src=40000,tp_dst=5201

bridge("edge1_1")
-----------------
 0. ip,nw_dst=10.3.1.0/24, priority 100
    group:5
     -> bucket 0: score 5448
     -> bucket 1: score 38040
     -> using bucket 1
    bucket 1
            output:4

Final flow: unchanged
Megaflow: recirc_id=0,eth,tcp,in_port=1,nw_src=10.1.1.1,nw_dst=10.3.1.1,nw_frag=no
Datapath actions: 4
"""


def test_trace_outputs_reads_the_chosen_bucket():
    assert trace_outputs(TRACE) == [4]
    assert trace_outputs("Datapath actions: drop\n") == []


def test_hash_selection_property_layout():
    raw = HashSelection(0xDEADBEEF).serialize()
    assert len(raw) % 8 == 0
    ptype, length, experimenter, exp_type = struct.unpack_from("!HHII", raw)
    assert (ptype, experimenter, exp_type) == (0xFFFF, 0x154D, 1)
    assert raw[16:32].rstrip(b"\0") == b"hash"
    assert struct.unpack_from("!Q", raw, 32)[0] == 0xDEADBEEF
    fields, offset = [], 40
    while offset < length:
        oxm_class, field_hm, width = struct.unpack_from("!HBB", raw, offset)
        assert oxm_class == 0x8000 and not field_hm & 1  # no has_mask: the value is the mask
        assert raw[offset + 4:offset + 4 + width] == b"\xff" * width
        fields.append(field_hm >> 1)
        offset += 4 + width
    assert offset == length and raw[length:] == b"\0" * (len(raw) - length)
    assert fields == [10, 11, 12, 13, 14, 15, 16]  # ip_proto, ipv4 src/dst, tcp/udp ports


def test_dp_hash_selection_carries_the_basis_and_no_fields():
    raw = HashSelection(0xDEADBEEF, "dp_hash").serialize()
    ptype, length, experimenter, exp_type = struct.unpack_from("!HHII", raw)
    assert (ptype, length, experimenter, exp_type) == (0xFFFF, 40, 0x154D, 1)
    assert raw[16:32].rstrip(b"\0") == b"dp_hash"
    # OVS reads the low 32 bits as the basis, the high ones as the algorithm (0: the 5-tuple)
    assert struct.unpack_from("!Q", raw, 32)[0] == 0xDEADBEEF and len(raw) == 40
    try:
        HashSelection(1, "random")
    except ValueError as err:
        assert "random" in str(err)
    else:
        raise AssertionError("an unknown selection method was accepted")


def test_vm_job_archive_carries_the_checkout_without_venvs(tmp_path):
    import io
    import tarfile

    from testbed.vm.guest import job_archive

    (tmp_path / "testbed" / "runs").mkdir(parents=True)
    (tmp_path / "testbed" / "x.py").write_text("x = 1\n")
    (tmp_path / "testbed" / "runs" / "registry.py").write_text("x = 1\n")  # code, not output
    (tmp_path / "runs" / "quickstart").mkdir(parents=True)  # the checkout's output folder
    (tmp_path / "runs" / "quickstart" / "results.json").write_text("{}")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / "exp.yaml").write_text("version: 1\n")
    raw = job_archive(tmp_path, "echo hi\n", {"experiment.yaml": tmp_path / "exp.yaml"})
    assert len(raw) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        names = set(tar.getnames())
        assert tar.extractfile("job.sh").read() == b"echo hi\n"
    assert {"project/testbed/x.py", "project/testbed/runs/registry.py", "experiment.yaml",
            "job.sh"} <= names
    assert not any(".venv" in n or n.startswith("project/runs") for n in names), names


def test_the_raw_qdisc_dump_reads_counters_from_tca_stats2():
    from testbed.linux.rawnl import QdiscDump

    def rta(kind: int, payload: bytes) -> bytes:
        raw = struct.pack("=HH", 4 + len(payload), kind) + payload
        return raw + b"\0" * (-len(raw) % 4)

    basic = rta(1, struct.pack("=QI", 123456, 78) + b"\0" * 4)
    queue = rta(3, struct.pack("=IIIII", 3, 27042, 5, 0, 9))
    attrs = rta(1, b"bfifo\0") + rta(7, basic + queue)
    tcmsg = struct.pack("=BxxxiIII", 0, 42, 0x100000, 0x10001, 1)
    msg = struct.pack("=IHHII", 16 + len(tcmsg) + len(attrs), 36, 2, 1, 0) + tcmsg + attrs
    dump = QdiscDump.__new__(QdiscDump)  # parsing only: no socket
    index, handle, stats = dump._qdisc(msg, 16, len(msg))
    assert (index, handle) == (42, 0x100000)
    assert stats == {"bytes": 123456, "packets": 78, "drops": 5, "backlog_bytes": 27042,
                     "backlog_packets": 3, "marked": 0}
    # a RED leaf's xstats (TCA_STATS_APP: early, pdrop, other, marked) give its CE marks
    app = rta(4, struct.pack("=IIII", 1, 2, 0, 77))
    attrs = rta(1, b"red\0") + rta(7, basic + queue + app)
    msg = struct.pack("=IHHII", 16 + len(tcmsg) + len(attrs), 36, 2, 1, 0) + tcmsg + attrs
    assert dump._qdisc(msg, 16, len(msg))[2]["marked"] == 77
    attrs = rta(1, b"bfifo\0") + rta(7, basic + queue + app)  # another kind's xstats: not marks
    msg = struct.pack("=IHHII", 16 + len(tcmsg) + len(attrs), 36, 2, 1, 0) + tcmsg + attrs
    assert dump._qdisc(msg, 16, len(msg))[2]["marked"] == 0
