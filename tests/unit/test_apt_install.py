"""hack/apt-install.sh (issue 33, item 1): `make test` runs node-deps and vllm-cpu side by side, and on a machine
without their packages both called apt-get at once; the second failed at once on apt's lists lock. Every apt step of
make's preparations now goes through this script, which holds one machine-wide flock around apt-get.

apt-get and dpkg-query are stand-ins on PATH here (the real ones would need the network and would change this
machine): the stand-in apt-get takes its lists lock as apt does, failing at once with apt's words where another
holds it, and dpkg-query answers from what the stand-in installed. What runs for real is the script itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "apt-install.sh"

APT_GET = """#!/bin/bash
exec 9>"$STUB_DIR/lists.lock"
flock -n 9 || { echo "E: Could not get lock $STUB_DIR/lists.lock. It is held by another apt-get" >&2; exit 100; }
echo "$*" >> "$STUB_DIR/apt.log"
case " $* " in
  *" update "*) sleep 1 ;;
  *" install "*)
    for arg in "$@"; do
      case $arg in -*|install|*::*) ;; *) echo "$arg" >> "$STUB_DIR/installed" ;; esac
    done ;;
esac
"""

DPKG_QUERY = """#!/bin/bash
pkg=${@: -1}
grep -qx "$pkg" "$STUB_DIR/installed" 2>/dev/null || exit 1
printf 'install ok installed'
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hack/apt-install.sh installs only as root (it says so otherwise)")


def stubbed(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apt-get", APT_GET), ("dpkg-query", DPKG_QUERY)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "installed").write_text("")
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_DIR": str(tmp_path),
        "SPECDEC_APT_LOCK": str(tmp_path / "specdec-apt.lock"),
    }


def test_two_callers_side_by_side_take_turns_and_each_package_is_installed_once(tmp_path: Path) -> None:
    env = stubbed(tmp_path)
    procs = [
        subprocess.Popen([str(SCRIPT), who, *pkgs], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for who, pkgs in (("node-deps", ["conntrack", "socat"]), ("vllm-cpu", ["socat", "libtcmalloc-minimal4"]))
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for proc, (_out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err  # without the flock, the second apt-get fails at once on the lists lock
    stderr = "".join(err for _, err in outs)
    assert "waiting for another apt-get of make's preparations" in stderr, stderr
    installed = (tmp_path / "installed").read_text().split()
    assert sorted(installed) == ["conntrack", "libtcmalloc-minimal4", "socat"], "the second installs only what is still missing"


def test_nothing_missing_calls_no_apt_get(tmp_path: Path) -> None:
    env = stubbed(tmp_path)
    (tmp_path / "installed").write_text("conntrack\nsocat\n")
    proc = subprocess.run([str(SCRIPT), "node-deps", "conntrack", "socat"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert not (tmp_path / "apt.log").exists()


def test_the_preparations_install_through_it() -> None:
    """node-deps and vllm-cpu (the two steps `make test` runs side by side) call this script, never apt-get itself."""
    for name in ("node-deps.sh", "vllm-cpu.sh"):
        text = (ROOT / "hack" / name).read_text()
        assert "apt-install.sh" in text, name
        commands = [line.split("#", 1)[0] for line in text.splitlines()]
        assert not [c for c in commands if c.lstrip().startswith("apt-get") or "| apt-get" in c or "&& apt-get" in c], name
