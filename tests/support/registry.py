"""A real container registry on 127.0.0.1 for the release test: the CNCF distribution registry (`registry serve`,
hack/tools.sh group `registry`, built from github.com/distribution/distribution/v3), plain HTTP, its storage a
temporary directory, and with a user (htpasswd, basic authentication) every request needs its credentials, as a
private mirror's do. `make release REGISTRY=127.0.0.1:PORT/specdec RELEASE_PLAIN_HTTP=1` pushes to it with the tools'
own logins; the real node's containerd pulls from it (hack/devcluster trust_registry) with the pods' imagePullSecrets;
what is in it is read over the registry's HTTP API (the OCI distribution spec), not from its files."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


class RegistryError(Exception):
    """The registry did not start, in one line with its log's last words."""


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    storage: Path
    process: subprocess.Popen[bytes]
    log: Path
    user: tuple[str, str] | None = None

    def get(self, path: str, accept: str = "application/json", auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        headers = {"Accept": accept}
        if auth and self.user:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(self.user).encode()).decode()
        request = urllib.request.Request(f"http://{self.host}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def catalog(self) -> list[str]:
        status, _, body = self.get("/v2/_catalog")
        assert status == 200, (status, body[:300])
        return sorted(json.loads(body)["repositories"])

    def tags(self, repository: str) -> list[str]:
        status, _, body = self.get(f"/v2/{repository}/tags/list")
        assert status == 200, (status, body[:300])
        return sorted(json.loads(body)["tags"] or [])

    def manifest(self, repository: str, reference: str) -> tuple[str, dict[str, object]]:
        """(digest, manifest) of a tag or digest, as a client resolving it sees them."""
        status, headers, body = self.get(f"/v2/{repository}/manifests/{reference}", accept=MANIFEST_TYPES)
        assert status == 200, (repository, reference, status, body[:300])
        digest = next(v for k, v in headers.items() if k.lower() == "docker-content-digest")
        return digest, json.loads(body)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bcrypt(password: str) -> str:
    """A bcrypt hash, the only one the registry's htpasswd accepts (glibc's crypt; the module is gone in Python 3.13)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
    except ImportError as error:
        raise RegistryError(f"no bcrypt for the registry's htpasswd file on this Python ({error}): run the tests with Python 3.11 or 3.12") from error
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))
    if not hashed or not hashed.startswith("$2"):
        raise RegistryError("this machine's crypt(3) makes no bcrypt hashes, which the registry's htpasswd needs")
    return hashed


def start(binary: Path, workdir: Path, timeout: float = 60, user: tuple[str, str] | None = None) -> Registry:
    """`registry serve` on a free port of 127.0.0.1, storing under ``workdir``; returns once /v2/ answers.
    With ``user`` (name, password) every request needs those credentials (htpasswd, basic authentication)."""
    storage = workdir / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = workdir / "config.yml"
    settings: dict[str, object] = {
        "version": "0.1",
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    if user:
        htpasswd = workdir / "htpasswd"
        htpasswd.write_text(f"{user[0]}:{_bcrypt(user[1])}\n")
        settings["auth"] = {"htpasswd": {"realm": "specdec-test", "path": str(htpasswd)}}
    # JSON is YAML: the registry's configuration file, upstream's format (configuration/configuration.go).
    config.write_text(json.dumps(settings))
    log = workdir / "registry.log"
    # No tracing exporter: upstream's default (OTLP to localhost:4318) would log a failed export now and then.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}
    with log.open("wb") as out:
        process = subprocess.Popen([str(binary), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    registry = Registry(host=f"127.0.0.1:{port}", storage=storage, process=process, log=log, user=user)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RegistryError(f"registry exited with {process.returncode}: {log.read_text()[-1500:]}")
        try:
            if registry.get("/v2/")[0] == 200:
                return registry
        except OSError:
            pass
        if time.monotonic() > deadline:
            registry.stop()
            raise RegistryError(f"registry did not answer on http://{registry.host}/v2/ within {timeout:.0f}s: {log.read_text()[-1500:]}")
        time.sleep(0.2)
