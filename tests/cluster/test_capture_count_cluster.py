"""The captured conversations counted, on the local control plane (docs/capture.md, "How many are stored"): the real
`specdec run` watches the capture proxy's pod through its pod index, reads the proxy's /metrics and writes the count
to status.retraining.capture.conversations; the count falls when records are deleted. The capture pod is a kwok pod
(nothing runs in it), so its address is mapped (--endpoints, by the `<name>-capture` key) to a real `specdec capture`
process run here in front of the speculative server's simulator, on a directory standing for the claim."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.capture import capture_state, delete_volume, make_volume
from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    example,
    status,
    wait_phase,
)
from tests.support.simulators import Simulators

pytestmark = pytest.mark.cluster


def start_proxy(upstream: str, directory: Path) -> tuple[subprocess.Popen[str], str, str]:
    """`specdec capture` as a pod runs it (every chat request kept): (process, traffic URL, admin URL)."""
    argv = [sys.executable, "-m", "specdec_operator.cli", "capture", "--upstream", upstream, "--dir", str(directory), "--sample-share", "1"]
    argv += ["--max-bytes", str(1 << 20), "--retention-hours", "1", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--writer", "pod-x"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "specdec capture serving at http://127.0.0.1:PORT (admin port N)"
    assert " at " in line, f"specdec capture did not start: {line!r}"
    traffic = line.split(" at ")[1].split()[0]
    admin_port = line.rsplit("admin port ", 1)[1].rstrip(")\n")
    return proc, traffic, f"http://127.0.0.1:{admin_port}"


async def chat_through(url: str, texts: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        for text in texts:
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0}
            async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
                assert answer.status == 200
                await answer.read()


def proxy_count(admin: str) -> float | None:
    from specdec_operator.controller.capturecount import stored_conversations

    with urllib.request.urlopen(admin + "/metrics", timeout=5) as answer:
        return stored_conversations(answer.read().decode())


def conversations(custom_objects: Any, namespace: str, name: str) -> int | None:
    return ((status(custom_objects, namespace, name).get("retraining") or {}).get("capture") or {}).get("conversations")


def test_the_operator_shows_the_proxies_count_of_the_claim_and_it_falls_with_deletions(
    operator: Operator, sims: Simulators, namespace: str, custom_objects: Any, core_v1: Any, tmp_path: Path
) -> None:
    name = "llama"
    speculative = sims.start("llama31-8b-eagle3").url
    operator.map(f"{name}-base", sims.start("llama31-8b-base").url)
    operator.map(f"{name}-spec", speculative)
    claim = tmp_path / "claim"
    claim.mkdir()
    # Records an earlier proxy pod wrote: three conversations and a completions prompt no training uses.
    earlier = claim / "capture-20261201T000000Z-000001-old-pod.jsonl"
    rows = [{"endpoint": "chat", "messages": [{"role": "user", "content": f"earlier {i}"}]} for i in range(3)]
    earlier.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"endpoint": "completions", "prompt": "p"}]))
    proxy, traffic, admin = start_proxy(speculative, claim)
    volume = None
    try:
        asyncio.run(chat_through(traffic, ["now one", "now two"]))
        # The proxy counts every 10 s: its figure is 5 before the operator reads it (else the operator's first read may
        # be the proxy's count at its start, 3, kept a minute).
        wait_until(lambda: proxy_count(admin) == 5, timeout=30, message="the proxy counted 5")
        operator.map(f"{name}-capture", admin)  # the capture pod's address (a kwok pod runs nothing)
        operator.script(name, **LLAMA_EAGLE3_SCRIPT)
        operator.start()
        cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations())
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
        assert wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Failed"}, timeout=120)["phase"] == "Promoted"
        volume = make_volume(core_v1, namespace)
        capture = {"sampleShare": 0.1, "maxBytes": 1 << 20, "storageClassName": volume}
        custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"retraining": {"capture": capture}}})
        wait_until(lambda: capture_state(custom_objects, namespace, name) == "On", timeout=90, message="capture On")
        wait_until(lambda: conversations(custom_objects, namespace, name) == 5, timeout=60, message="5 conversations in status")
        earlier.unlink()  # as the retention deletes a file
        wait_until(lambda: conversations(custom_objects, namespace, name) == 2, timeout=120, message="the count falls to 2")
        off = {"spec": {"retraining": {"capture": {"enabled": False}}}}
        custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, off)
        wait_until(lambda: capture_state(custom_objects, namespace, name) is None, timeout=90, message="status.retraining cleared")
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        if volume is not None:
            delete_volume(core_v1, volume)
