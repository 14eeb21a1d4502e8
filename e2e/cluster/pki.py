"""Certificates and keys for one test cluster, made locally with the `openssl` command.

All keys are ECDSA P-256 (fast to generate; Kubernetes accepts them for serving, client
certificates and service-account token signing). Nothing here is meant to outlive the cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = 30


class PKIError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if not exe:
        raise PKIError("the `openssl` command is needed to make the test cluster's certificates")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PKIError(f"openssl {' '.join(args)} failed:\n{proc.stderr.strip()}")


def _key(path: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(path),
        cwd=path.parent,
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str = "ca") -> Pair:
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pair.key),
        "-subj",
        f"/CN=octavo-e2e-{name}",
        "-days",
        str(DAYS),
        "-out",
        str(pair.cert),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )
    return pair


def _subject(common_name: str, organizations: tuple[str, ...]) -> str:
    return "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"


def issue(
    ca: Pair,
    directory: Path,
    name: str,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    server: bool = False,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> Pair:
    """A leaf certificate signed by CA: a client certificate, or a serving one when SERVER."""
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    _openssl(
        "req",
        "-new",
        "-key",
        str(pair.key),
        "-subj",
        _subject(common_name, organizations),
        "-out",
        str(csr),
        cwd=directory,
    )
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}",
    ]
    sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-set_serial",
        str(int.from_bytes(os.urandom(8), "big")),
        "-days",
        str(DAYS),
        "-extfile",
        str(ext),
        "-out",
        str(pair.cert),
        cwd=directory,
    )
    csr.unlink()
    ext.unlink()
    return pair


def service_account_keys(directory: Path) -> Pair:
    """The key pair that signs service-account tokens (`cert` is the public key here)."""
    pair = Pair(directory / "sa.pub", directory / "sa.key")
    _key(pair.key)
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert), cwd=directory)
    return pair
