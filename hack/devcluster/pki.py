"""Certificates (openssl CLI; generated once per cluster directory and kept) and kubeconfigs for each identity."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

from . import realnode
from .state import ClusterError

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
DNS.1 = localhost
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
IP.1 = 127.0.0.1
IP.2 = 10.96.0.1
"""

# (file stem, subject, profile): who talks to the apiserver with which identity.
_CERTS = (
    ("apiserver", "/CN=kube-apiserver", "server"),
    ("admin", "/O=system:masters/CN=specdec-admin", "client"),
    ("controller-manager", "/CN=system:kube-controller-manager", "client"),
    ("scheduler", "/CN=system:kube-scheduler", "client"),
    # kwok plays every kubelet and patches pod/node status across namespaces.
    ("kwok", "/O=system:masters/CN=kwok-controller", "client"),
)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def _ensure_pki(pki: Path) -> None:
    if all((pki / f"{stem}.crt").exists() for stem, _, _ in _CERTS) and (pki / "sa.key").exists():
        return
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is not installed; install it (apt-get install openssl) and rerun")
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    config = pki / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=specdec-dev-ca",
        "-config",
        "openssl.cnf",
        "-extensions",
        "ca",
        cwd=pki,
    )
    for stem, subject, profile in _CERTS:
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{stem}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")),
            "-days",
            "3650",
            "-out",
            f"{stem}.crt",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            profile,
            cwd=pki,
        )
        (pki / f"{stem}.csr").unlink()
    # Service-account token signing key (the apiserver signs, the controller-manager signs legacy tokens).
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


# The real node's identities, made only for clusters started with a real node (signed by the same CA).
_NODE_CERTS = (
    ("kubelet", f"/O=system:nodes/CN=system:node:{realnode.NODE_NAME}", "client"),
    ("kube-proxy", "/CN=system:kube-proxy", "client"),
    ("coredns", "/CN=specdec:coredns", "client"),
    # The API server's client certificate towards the kubelet (logs, exec, port-forward).
    ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "client"),
)


def _ensure_node_pki(pki: Path) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for stem, subject, profile in _NODE_CERTS:
        if (pki / f"{stem}.crt").exists():
            continue
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{stem}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")),
            "-days",
            "3650",
            "-out",
            f"{stem}.crt",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            profile,
            cwd=pki,
        )
        (pki / f"{stem}.csr").unlink()


def _kubeconfig(server: str, pki: Path, user: str, context: str, embed: bool) -> str:
    """A kubeconfig for one identity; ``embed`` inlines the certificates so the file can be copied alone."""

    def ref(key: str, path: Path) -> str:
        if embed:
            return f"{key}-data: {base64.b64encode(path.read_bytes()).decode()}"
        return f"{key}: {path}"

    return f"""apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server}
    {ref("certificate-authority", pki / "ca.crt")}
users:
- name: {context}-{user}
  user:
    {ref("client-certificate", pki / f"{user}.crt")}
    {ref("client-key", pki / f"{user}.key")}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {context}-{user}
current-context: {context}
"""
