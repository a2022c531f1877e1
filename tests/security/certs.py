"""Real certificates for the TLS tests, made with the ``openssl`` CLI: a CA, a server certificate for
127.0.0.1/localhost and a client certificate, all signed by the CA; and a second CA nobody trusts."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate from another CA
    rogue_key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-key.pem", "-out", f"{name}.csr",
         "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem",
         "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-sha256", "-extfile", f"{name}.ext",
         cwd=d)  # fmt: skip


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "rogue-ca"):
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}-key.pem", "-out", f"{ca}.pem",
             "-days", "2", "-subj", f"/CN=watchd test {ca}", cwd=d)  # fmt: skip
    _leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _leaf(d, "rogue", "rogue-ca", "extendedKeyUsage=clientAuth\n")
    for key in d.glob("*-key.pem"):
        key.chmod(0o600)
    return Certs(
        d / "ca.pem", d / "server.pem", d / "server-key.pem", d / "client.pem", d / "client-key.pem",
        d / "rogue.pem", d / "rogue-key.pem",
    )  # fmt: skip
