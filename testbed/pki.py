"""Keys and certificates of the local control plane, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """Paths of the bed's key material."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        """The CA that signs the API server's serving certificate."""
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """The CA's key."""
        return self.dir / "ca.key"

    @property
    def server_cert(self) -> Path:
        """The API server's serving certificate."""
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        """The API server's serving key."""
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        """The service-account signing key."""
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """The service-account verification key."""
        return self.dir / "sa.pub"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path, *, ips: list[str]) -> Pki:
    """A CA, a serving certificate for ``ips`` (and localhost), and a service-account key."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-keyout",
        str(pki.ca_key),
        "-out",
        str(pki.ca_cert),
        "-subj",
        "/CN=llm-retire-bed-ca",
    )
    san = ",".join(
        [
            *(f"IP:{ip}" for ip in ips),
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
        ]
    )
    csr = directory / "apiserver.csr"
    ext = directory / "apiserver.ext"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    _signed(pki, key=pki.server_key, cert=pki.server_cert, cn="kube-apiserver", csr=csr, ext=ext)
    _openssl("genrsa", "-out", str(pki.sa_key), "2048")
    _openssl("rsa", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki


def make_client_cert(pki: Pki, name: str, *, cn: str) -> tuple[Path, Path]:
    """A client certificate (``clientAuth``) with subject ``cn``, signed by ``pki``'s CA.

    For mTLS: returns the certificate's and its key's paths, ``NAME.crt`` and ``NAME.key``.
    """
    cert, key = pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
    csr, ext = pki.dir / f"{name}.csr", pki.dir / f"{name}.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    _signed(pki, key=key, cert=cert, cn=cn, csr=csr, ext=ext)
    return cert, key


def _signed(pki: Pki, *, key: Path, cert: Path, cn: str, csr: Path, ext: Path) -> None:
    """A new key and a certificate for subject ``cn``, signed by ``pki``'s CA for 30 days
    with the extensions in ``ext``."""
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", f"/CN={cn}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-days", "30", "-out", str(cert), "-extfile", str(ext),
    )  # fmt: skip
