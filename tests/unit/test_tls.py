"""OpenFlow over TLS (``controller.tls``): the run's certificates, and the eBPF switches'
agent speaking OpenFlow through them to a controller that requires them (loopback, no root)."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest
from cryptography import x509
from os_ken.ofproto import ofproto_v1_5_parser as parser

from testbed.linux.pki import make_run_pki
from tests.unit.test_switch_agent import _read_messages, edge_agent
from tests.unit.test_switch_session import FakeDatapath, _wire


def _server_context(pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.controller_cert, pki.controller_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # as os-ken is run: a switch must present one
    return ctx


def _client_context(pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki.ca)
    ctx.load_cert_chain(pki.switch_cert, pki.switch_key)
    return ctx


def test_a_runs_certificates_name_the_run_and_keep_their_keys_private(tmp_path):
    pki = make_run_pki(tmp_path / "pki", "20261202-1-abc", "127.0.0.1")
    assert oct((tmp_path / "pki").stat().st_mode & 0o777) == "0o700"
    for key in (pki.controller_key, pki.switch_key):
        assert oct(key.stat().st_mode & 0o777) == "0o600"
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    ctl = x509.load_pem_x509_certificate(pki.controller_cert.read_bytes())
    assert "20261202-1-abc" in ca.subject.rfc4514_string()
    assert ctl.issuer == ca.subject
    sans = ctl.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert not list((tmp_path / "pki").glob("ca-key*"))  # the authority signs once, then goes


def _agent_against(server_ctx, client_ctx, tmp_path):
    """An agent with one switch, connecting to a TLS listener; (the agent, the listener)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    agent, topo = edge_agent(server, tls=client_ctx)
    return agent, server, topo


def test_the_ebpf_agent_speaks_openflow_through_tls(tmp_path):
    pki = make_run_pki(tmp_path / "pki", "run", "127.0.0.1")
    agent, server, topo = _agent_against(_server_context(pki), _client_context(pki), tmp_path)
    accepted = {}

    def accept():
        raw, _ = server.accept()
        accepted["conn"] = _server_context(pki).wrap_socket(raw, server_side=True)

    thread = threading.Thread(target=accept)
    thread.start()
    agent.start()
    try:
        thread.join(10)
        conn = accepted["conn"]
        peer = conn.getpeercert()
        assert any("run switch" in str(v) for rdn in peer["subject"] for _k, v in rdn)
        dp = FakeDatapath()
        conn.sendall(_wire(parser.OFPHello(dp), 1) + _wire(parser.OFPFeaturesRequest(dp), 2))
        (features,) = [m for m in _read_messages(conn, parser.OFPSwitchFeatures)
                       if isinstance(m, parser.OFPSwitchFeatures)]
        assert features.datapath_id == topo.nodes["edge1_1"].dpid
        # many messages in one TLS record and across records: every one answered
        conn.sendall(b"".join(_wire(parser.OFPEchoRequest(dp, data=bytes([i]) * 900), 10 + i)
                              for i in range(40)))
        echoes = []
        while len(echoes) < 40:
            echoes += [m for m in _read_messages(conn, parser.OFPEchoReply)
                       if isinstance(m, parser.OFPEchoReply)]
        assert sorted(m.xid for m in echoes) == list(range(10, 50))
        conn.close()
    finally:
        agent.stop()
        server.close()
    assert not [e for e in agent.errors if "closed" not in e], agent.errors


def test_a_switch_without_the_runs_certificate_is_refused(tmp_path):
    pki = make_run_pki(tmp_path / "pki", "run", "127.0.0.1")
    other = make_run_pki(tmp_path / "other", "another-run", "127.0.0.1")
    agent, server, _ = _agent_against(_server_context(pki), _client_context(other), tmp_path)
    outcome = {}

    def accept():
        raw, _ = server.accept()
        try:
            _server_context(pki).wrap_socket(raw, server_side=True)
            outcome["accepted"] = True
        except (ssl.SSLError, OSError) as err:
            outcome["refused"] = str(err)

    thread = threading.Thread(target=accept)
    thread.start()
    with pytest.raises(Exception) as err:  # the agent does not trust the other controller
        agent.start()
    thread.join(10)
    server.close()
    assert "refused" in outcome and "accepted" not in outcome
    assert "certificate" in str(err.value).lower() or "refused it" in str(err.value)
