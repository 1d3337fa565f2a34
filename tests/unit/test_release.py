"""`make release` (hack/release.sh) without a registry: the plugin's files (the wheel, the krew archive and its manifest)
and the one-line refusals of bad input. Pushing to a real registry, installing the chart from it and the node pulling
from it are tests/cluster/test_realnode_e2e.py's (it also installs the plugin from the archive and runs it through
kubectl)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tarfile
import tomllib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASE = ROOT / "hack" / "release.sh"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
URL = "https://downloads.example.test/specdec/v" + VERSION


def release(*steps: str, env: dict[str, str] | None = None, dist: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RELEASE_") and k != "REGISTRY"}
    full.update(env or {})
    if dist is not None:
        full["RELEASE_DIST"] = str(dist)
    return subprocess.run([str(RELEASE), *steps], env=full, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def plugin_release(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    dist = tmp_path_factory.mktemp("dist")
    proc = release("plugin", env={"RELEASE_URL": URL}, dist=dist)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dist


def test_the_krew_manifest_names_the_archive_by_its_sha256(plugin_release: pathlib.Path) -> None:
    archive = plugin_release / f"kubectl-specdec-{VERSION}.tar.gz"
    manifest = yaml.safe_load((plugin_release / "krew" / "specdec.yaml").read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == "specdec"  # kubectl krew install specdec -> `kubectl specdec`
    spec = manifest["spec"]
    assert spec["version"] == f"v{VERSION}"
    assert spec["shortDescription"] and spec["homepage"]
    (platform,) = spec["platforms"]
    assert platform["uri"] == f"{URL}/kubectl-specdec-{VERSION}.tar.gz"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert {e["values"][0] for e in platform["selector"]["matchExpressions"]} <= {"linux", "darwin"}
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    wheel = f"specdec_operator-{VERSION}-py3-none-any.whl"
    assert set(members) == {"kubectl-specdec", wheel}
    # krew copies `files` out of the archive and links `bin`; the launcher must be among them, executable.
    assert platform["bin"] == "kubectl-specdec" and members["kubectl-specdec"].mode & 0o111
    copied = {f["from"] for f in platform["files"]}
    assert all(any(pathlib.PurePath(name).match(pattern) for pattern in copied) for name in members)
    # The wheel in the archive is the release's wheel, and release.txt lists both with their sha256.
    assert (plugin_release / wheel).is_file()
    listed = (plugin_release / "release.txt").read_text().splitlines()
    assert f"plugin {archive} sha256:{platform['sha256']}" in listed
    assert any(line.startswith(f"plugin {plugin_release / wheel} sha256:") for line in listed)


def test_the_wheel_carries_the_kubectl_plugin_entry_point(plugin_release: pathlib.Path) -> None:
    import zipfile

    with zipfile.ZipFile(plugin_release / f"specdec_operator-{VERSION}-py3-none-any.whl") as wheel:
        entry_points = wheel.read(f"specdec_operator-{VERSION}.dist-info/entry_points.txt").decode()
        names = wheel.namelist()
    assert "kubectl-specdec = specdec_operator.cli.kubectl_specdec:main" in entry_points
    assert "specdec_operator/cli/kubectl_specdec.py" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]


def test_the_launcher_says_which_python_it_needs(plugin_release: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with tarfile.open(plugin_release / f"kubectl-specdec-{VERSION}.tar.gz") as tar:
        tar.extractall(tmp_path / "store", filter="data")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubectl-specdec").symlink_to(tmp_path / "store" / "kubectl-specdec")
    env = {**os.environ, "SPECDEC_PLUGIN_HOME": str(tmp_path / "home"), "SPECDEC_PYTHON": "python3-does-not-exist"}
    proc = subprocess.run([str(tmp_path / "bin" / "kubectl-specdec"), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "kubectl-specdec: error: python3-does-not-exist not found: the plugin needs Python >= 3.11 (install it, or set SPECDEC_PYTHON)"
    )
    # An interpreter too old for the plugin is refused before anything is installed.
    old = tmp_path / "python-old"
    old.write_text('#!/bin/sh\ncase "$2" in *version_info*) exit 1 ;; *) echo 3.9.18 ;; esac\n')
    old.chmod(0o755)
    proc = subprocess.run(
        [str(tmp_path / "bin" / "kubectl-specdec"), "--help"], env={**env, "SPECDEC_PYTHON": str(old)}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "is Python 3.9.18: the plugin needs >= 3.11" in proc.stderr, proc.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        (None, "release: error: REGISTRY is not set: name the registry to push to, e.g. make release REGISTRY=registry.example.com/ml/specdec"),
        ("https://registry.example.com/ml", "release: error: REGISTRY=https://registry.example.com/ml: give HOST[:PORT]/PATH without a scheme"),
        ("registry.example.com", "release: error: REGISTRY=registry.example.com: give HOST[:PORT]/PATH (the chart goes to PATH/charts"),
    ],
)
def test_a_release_without_a_usable_registry_says_what_to_set(registry: str | None, message: str, tmp_path: pathlib.Path) -> None:
    proc = release(env={"REGISTRY": registry} if registry else {}, dist=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith(message), proc.stderr


@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed (apt-get install buildah)")
def test_the_training_image_is_refused_with_the_reason_when_it_is_not_built(tmp_path: pathlib.Path) -> None:
    proc = release(
        "images",
        env={
            "REGISTRY": "127.0.0.1:9/specdec",
            "RELEASE_IMAGES": "training",
            "IMAGE_BUILDER": "buildah",
            "SPECDEC_IMAGES_DIR": str(tmp_path / "images"),
        },
        dist=tmp_path / "dist",
    )
    assert proc.returncode == 1
    assert "release: error: ghcr.io/specdec/drafter-training:0.1.0 is not built here: the training image needs its CUDA base" in proc.stderr, (
        proc.stderr
    )
