"""Certificates made in the test (the `cryptography` package), for a real TLS server on 127.0.0.1:
a CA, and server certificates it signs: one good for 127.0.0.1, one for another host name, one
expired; plus a self-signed one no CA vouches for.

    certs = make_certs(tmp_path)
    FakeServer(handler, ssl_context=certs.server_context("good"))
    certs.ca_file  # the CA bundle (PEM) a client trusts with [target] tls_ca_file
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Certs:
    dir: Path
    ca_file: Path

    def server_context(self, which: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.dir / f"{which}.crt", self.dir / f"{which}.key")
        return ctx


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("agentload test CA")).issuer_name(_name("agentload test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - day).not_valid_after(now + 30 * day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(name: str, sans: list[x509.GeneralName], before, after, self_signed: bool = False) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        issuer, signer = (_name(name), key) if self_signed else (ca.subject, ca_key)
        b = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(before).not_valid_after(after)
             .add_extension(x509.SubjectAlternativeName(sans), critical=False)
             .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        if not self_signed:
            b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                critical=False)
        cert = b.sign(signer, hashes.SHA256())
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{name}.key").write_bytes(_pem_key(key))

    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    leaf("good", local, now - day, now + 30 * day)
    leaf("otherhost", [x509.DNSName("not-this-host.example")], now - day, now + 30 * day)
    leaf("expired", local, now - 30 * day, now - 2 * day)
    leaf("selfsigned", local, now - day, now + 30 * day, self_signed=True)
    return Certs(d, d / "ca.pem")
