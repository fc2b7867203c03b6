"""A run's own certificates for OpenFlow over TLS (``controller.tls``): a certificate authority
made for the run, a certificate for the controller (its listening address in the subject's
alternative names) and one the switches present, every key written 0600 into the run
directory and gone with it. The controller accepts only switches with a certificate of this
run's authority, the switches only this run's controller."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class RunPki:
    """The files of a run's certificates (a cluster machine has the switches' only)."""

    ca: Path
    controller_cert: Path | None
    controller_key: Path | None
    switch_cert: Path
    switch_key: Path

    def switch_side(self) -> dict[str, str]:
        """What a cluster machine's switches need, as text (sent to its actor as data): the
        authority's certificate and the switches' certificate and key."""
        return {"ca": self.ca.read_text(), "switch_cert": self.switch_cert.read_text(),
                "switch_key": self.switch_key.read_text()}

    def client_context(self) -> ssl.SSLContext:
        """The switches' side of OpenFlow over TLS: this run's controller only, this run's
        switch certificate presented."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(self.ca)
        ctx.load_cert_chain(self.switch_cert, self.switch_key)
        return ctx


def check_switch_pki(texts: object) -> dict[str, str]:
    """The switches' certificates as a cluster machine receives them: three PEM texts that
    load (:meth:`RunPki.switch_side`).

    Raises:
        ValueError: anything else.
    """
    if not isinstance(texts, dict) or set(texts) != {"ca", "switch_cert", "switch_key"} \
            or not all(isinstance(v, str) and len(v) < 20_000 for v in texts.values()):
        raise ValueError("the switches' certificates are {ca, switch_cert, switch_key} PEM text")
    x509.load_pem_x509_certificate(texts["ca"].encode())
    x509.load_pem_x509_certificate(texts["switch_cert"].encode())
    serialization.load_pem_private_key(texts["switch_key"].encode(), password=None)
    return texts


def write_switch_pki(directory: Path, texts: object) -> RunPki:
    """A cluster machine's copy of the switches' certificates (:func:`check_switch_pki`),
    written 0600 under ``directory`` (created 0700)."""
    texts = check_switch_pki(texts)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return RunPki(ca=_write(directory / "ca.pem", texts["ca"].encode(), 0o600),
                  controller_cert=None, controller_key=None,
                  switch_cert=_write(directory / "switch-cert.pem",
                                     texts["switch_cert"].encode(), 0o600),
                  switch_key=_write(directory / "switch-key.pem",
                                    texts["switch_key"].encode(), 0o600))


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fabriclab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, data: bytes, mode: int) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)
    return path


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_run_pki(directory: Path, run_id: str, controller_ip: str) -> RunPki:
    """The authority and both certificates of run ``run_id``, under ``directory`` (created 0700).

    Args:
        directory: where the files go.
        run_id: named in every subject (which run a certificate belongs to).
        controller_ip: the address the controller listens on (the switches check it).
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"fabriclab run {run_id} CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(common: str, usage, ip: str | None) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if ip is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_bytes(key)

    ctl_cert, ctl_key = leaf(f"fabriclab run {run_id} controller",
                             ExtendedKeyUsageOID.SERVER_AUTH, controller_ip)
    sw_cert, sw_key = leaf(f"fabriclab run {run_id} switch", ExtendedKeyUsageOID.CLIENT_AUTH,
                           None)
    return RunPki(
        ca=_write(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM), 0o644),
        controller_cert=_write(directory / "controller-cert.pem", ctl_cert, 0o644),
        controller_key=_write(directory / "controller-key.pem", ctl_key, 0o600),
        switch_cert=_write(directory / "switch-cert.pem", sw_cert, 0o644),
        switch_key=_write(directory / "switch-key.pem", sw_key, 0o600))
