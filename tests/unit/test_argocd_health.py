"""The Argo CD health check (docs/argocd-health.lua), run in a real Lua runtime against sample objects.

Argo CD evaluates health scripts with gopher-lua, a Lua 5.1 implementation, in a sandbox without the os/io
libraries; the tests run the same file under lupa's Lua 5.1 with the same restriction, with `obj` set the way
Argo CD sets it (the live object converted from JSON into nested tables).
"""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import pytest
import yaml

lupa51 = pytest.importorskip("lupa.lua51")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "argocd-health.lua"
INSTALL_DOC = ROOT / "docs" / "install.md"

# The phases the API defines; every one must map to a decided health (never Unknown).
PHASES = ["Pending", "Validating", "Deploying", "Probing", "Promoted", "RolledBack", "Invalid", "Failed"]


def _to_lua(lua: Any, value: Any) -> Any:
    """JSON value -> Lua value, as Argo CD converts the live object (arrays become 1-based sequences)."""
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the health script on `obj` in a fresh Lua 5.1 state without os/io; return {status, message}."""
    lua = lupa51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    # Argo CD's sandbox: no os, io, package loading or debug access.
    lua.execute("os = nil; io = nil; require = nil; dofile = nil; loadfile = nil; debug = nil; package = nil")
    lua.globals().obj = _to_lua(lua, obj)
    result = lua.execute(SCRIPT.read_text())
    assert result is not None, "the script must return a table"
    out = dict(result.items())
    assert set(out) == {"status", "message"}, f"unexpected keys {sorted(out)}"
    assert isinstance(out["message"], str) and out["message"], "Argo CD shows the message: it must not be empty"
    return out


def sps(
    phase: str | None = None,
    *,
    ready: str | None = None,
    generation: int = 3,
    observed: int | None = 3,
    reason: str | None = None,
    message: str | None = None,
    ready_message: str = "",
    ready_reason: str | None = None,
    **status: Any,
) -> dict:
    """A SpeculativeServer as the API server returns it."""
    obj: dict[str, Any] = {
        "apiVersion": "specdec.io/v1alpha1",
        "kind": "SpeculativeServer",
        "metadata": {"name": "llama31-8b", "namespace": "serving", "generation": generation},
        "spec": {"image": "lmsysorg/sglang:v0.5.23-cu130"},
    }
    if phase is None:
        return obj
    st: dict[str, Any] = {"phase": phase, **status}
    if observed is not None:
        st["observedGeneration"] = observed
    if reason is not None:
        st["reason"] = reason
    if message is not None:
        st["message"] = message
    conditions = [{"type": "DrafterCompatible", "status": "True", "reason": "Compatible", "message": ""}]
    if ready is not None:
        conditions.append(
            {"type": "Ready", "status": ready, "reason": ready_reason or ("Serving" if ready == "True" else "NotServing"), "message": ready_message}
        )
    st["conditions"] = conditions
    obj["status"] = st
    return obj


def test_promoted_is_healthy_with_the_speedup():
    out = health(sps("Promoted", ready="True", speedup=1.8734, activeVariant="speculative"))
    assert out["status"] == "Healthy"
    assert "1.87x" in out["message"]


def test_promoted_without_a_ready_condition_is_still_healthy():
    assert health(sps("Promoted"))["status"] == "Healthy"


def test_promoted_but_not_ready_is_degraded():
    out = health(sps("Promoted", ready="False", ready_message="speculative pods crash-looping"))
    assert out == {"status": "Degraded", "message": "Promoted, but not Ready: speculative pods crash-looping"}


@pytest.mark.parametrize("phase", ["Promoted", "RolledBack"])
def test_decided_while_the_stable_service_is_being_created_is_progressing(phase):
    out = health(
        sps(
            phase,
            ready="False",
            ready_reason="ServicePending",
            ready_message="stable Service llama31-8b is being created; it will select the base server",
        )
    )
    assert out["status"] == "Progressing"
    assert out["message"].startswith(phase) and "being created" in out["message"]


def test_rolled_back_and_ready_is_healthy_and_says_why():
    out = health(sps("RolledBack", ready="True", reason="SpeedupBelowThreshold", message="speedup 0.36x [0.33, 0.40] at batch-128 < 1.10"))
    assert out["status"] == "Healthy"
    assert "SpeedupBelowThreshold" in out["message"] and "0.36x" in out["message"]


@pytest.mark.parametrize("ready,expected", [("False", "Degraded"), ("Unknown", "Progressing"), (None, "Progressing")])
def test_rolled_back_without_a_ready_base_is_not_healthy(ready, expected):
    assert health(sps("RolledBack", ready=ready, reason="AcceptanceDrift"))["status"] == expected


@pytest.mark.parametrize("phase", ["Pending", "Validating", "Deploying", "Probing"])
def test_work_in_progress_is_progressing(phase):
    out = health(sps(phase, ready="Unknown", message="loading weights since 2026-12-02T10:00:00Z"))
    assert out["status"] == "Progressing"
    assert out["message"].startswith(phase) and "since 2026-12-02T10:00:00Z" in out["message"]


@pytest.mark.parametrize("phase", ["Invalid", "Failed"])
def test_invalid_and_failed_are_degraded_with_the_reason(phase):
    out = health(sps(phase, ready="False", reason="HiddenSizeMismatch", message="drafter hidden_size 4096 != target 7168"))
    assert out["status"] == "Degraded"
    assert "HiddenSizeMismatch" in out["message"] and "7168" in out["message"]


def test_no_status_yet_is_progressing():
    assert health(sps(None))["status"] == "Progressing"
    obj = sps(None)
    obj["status"] = {}
    assert health(obj)["status"] == "Progressing"


def test_unobserved_spec_change_is_progressing_even_when_promoted():
    out = health(sps("Promoted", ready="True", generation=5, observed=4))
    assert out["status"] == "Progressing"
    assert "5" in out["message"]


def test_missing_observed_generation_falls_back_to_the_phase():
    assert health(sps("Invalid", observed=None, reason="VocabMismatch"))["status"] == "Degraded"


def test_unknown_phase_is_unknown():
    assert health(sps("Hibernating"))["status"] == "Unknown"


def test_every_api_phase_has_a_decided_health():
    from specdec_operator.api import Phase

    assert sorted(p.value for p in Phase) == sorted(PHASES), "a phase was added to the API: map it in the script"
    for phase in PHASES:
        assert health(sps(phase, ready="True"))["status"] in {"Healthy", "Progressing", "Degraded"}, phase


def test_status_written_by_the_models_round_trips():
    """A status built with the API models (what the operator writes) is read correctly by the script."""
    from specdec_operator import api, resource

    status = api.SpeculativeServerStatus(
        phase=api.Phase.ROLLED_BACK,
        reason="DrafterNotAccepting",
        message="accept length 1.00",
        observed_generation=2,
        conditions=[api.Condition(type="Ready", status="True", reason="BaseServing", message="")],
    )
    obj = sps(None, generation=2)
    obj["status"] = resource.dump(status)
    out = health(obj)
    assert out["status"] == "Healthy" and "DrafterNotAccepting" in out["message"]


def test_script_does_not_mutate_its_input_and_is_deterministic():
    obj = sps("Probing", ready="Unknown", message="round 3/8")
    before = copy.deepcopy(obj)
    assert health(obj) == health(obj)
    assert obj == before


def test_install_doc_registers_this_exact_script():
    """docs/install.md shows the argocd-cm entry; its Lua must be this file, key and all."""
    text = INSTALL_DOC.read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) for d in yaml.safe_load_all(block)]
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "argocd-cm":
            key = "resource.customizations.health.specdec.io_SpeculativeServer"
            assert doc["data"][key].strip() == SCRIPT.read_text().strip()
            return
    pytest.fail("docs/install.md has no argocd-cm ConfigMap example")


# -------------------------------------------------------------------------------------------------------------
# Flux: the CEL health checks in docs/install.md, evaluated with cel-python the way kustomize-controller does
# (the object's top-level fields are the variables; inProgress first, then failed, then current, else in progress).


def flux_checks() -> dict[str, str]:
    text = INSTALL_DOC.read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) for d in yaml.safe_load_all(block)]
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Kustomization":
            (check,) = doc["spec"]["healthCheckExprs"]
            assert (check["apiVersion"], check["kind"]) == ("specdec.io/v1alpha1", "SpeculativeServer")
            return {k: check[k] for k in ("inProgress", "failed", "current")}
    pytest.fail("docs/install.md has no Flux Kustomization with healthCheckExprs")


def flux_health(obj: dict[str, Any]) -> str:
    import celpy

    env = celpy.Environment()
    activation = {k: celpy.json_to_cel(v) for k, v in obj.items()}
    for outcome, key in (("InProgress", "inProgress"), ("Failed", "failed"), ("Current", "current")):
        result = env.program(env.compile(flux_checks()[key])).evaluate(activation)
        assert not isinstance(result, Exception), f"{key}: {result}"
        if bool(result):
            return outcome
    return "InProgress"


# Argo CD health -> the Flux outcome it corresponds to.
ARGO_TO_FLUX = {"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}

SAMPLES = [
    sps(None),
    sps("Pending"),
    sps("Validating", ready="Unknown"),
    sps("Deploying"),
    sps("Probing", ready="Unknown"),
    sps("Promoted", ready="True", speedup=1.4),
    sps("Promoted"),
    sps("Promoted", ready="False"),
    sps("Promoted", ready="True", generation=5, observed=4),
    sps("RolledBack", ready="True", reason="SpeedupBelowThreshold"),
    sps("RolledBack", ready="False"),
    sps("RolledBack", ready="Unknown"),
    sps("RolledBack"),
    sps("Invalid", ready="False", reason="HiddenSizeMismatch"),
    sps("Failed"),
    sps("Promoted", ready="False", ready_reason="ServicePending"),
    sps("RolledBack", ready="False", ready_reason="ServicePending"),
]


@pytest.mark.parametrize(
    "obj",
    SAMPLES,
    ids=lambda o: (
        f"{(o.get('status') or {}).get('phase')}-"
        f"{[(c['status'], c['reason']) for c in (o.get('status') or {}).get('conditions', []) if c['type'] == 'Ready']}"
    ),
)
def test_flux_health_checks_agree_with_the_argocd_check(obj):
    assert flux_health(obj) == ARGO_TO_FLUX[health(obj)["status"]]
