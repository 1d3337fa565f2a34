"""hack/demo.py's closing check: the GPUs each resource holds against what its spec and rollout.keepBaseWarm imply
(issue 33: the old check asserted 0 idle GPUs, which every status said whatever happened)."""

from __future__ import annotations

from hack import demo


def item(name: str, phase: str, gpus: dict | None, *, replicas: int = 1, per_server: int = 1, **rollout: bool) -> dict:
    status: dict = {"phase": phase}
    if gpus is not None:
        status["gpus"] = gpus
    spec = {"replicas": replicas, "resources": {"gpus": per_server}, "rollout": rollout}
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def metrics_text(**by_name: dict) -> str:
    lines = []
    for name, gpus in by_name.items():
        for variant in ("base", "speculative"):
            lines.append(f'specdec_gpus{{namespace="{demo.NAMESPACE}",name="{name}",variant="{variant}"}} {gpus[variant]}.0')
        lines.append(f'specdec_idle_gpus{{namespace="{demo.NAMESPACE}",name="{name}"}} {gpus["idle"]}.0')
    lines.append('specdec_idle_gpus{namespace="elsewhere",name="other"} 8.0')
    return "# TYPE specdec_gpus gauge\n# TYPE specdec_idle_gpus gauge\n" + "\n".join(lines) + "\n"


def test_what_a_spec_implies_for_each_settled_phase():
    assert demo.expected_gpus(item("a", "Promoted", None)) == {"base": 1, "speculative": 1, "idle": 1}  # keepBaseWarm defaults to true
    assert demo.expected_gpus(item("a", "Promoted", None, per_server=8, keepBaseWarm=False)) == {"base": 0, "speculative": 8, "idle": 0}
    assert demo.expected_gpus(item("a", "RolledBack", None, per_server=8)) == {"base": 8, "speculative": 0, "idle": 0}
    assert demo.expected_gpus(item("a", "RolledBack", None, keepSpeculativeWarm=True)) == {"base": 1, "speculative": 1, "idle": 1}
    assert demo.expected_gpus(item("a", "Invalid", None, keepSpeculativeWarm=True)) == {"base": 1, "speculative": 0, "idle": 0}
    # A fleet walks every server to the winner whatever keepBaseWarm says.
    assert demo.expected_gpus(item("f", "Promoted", None, replicas=4, per_server=8)) == {"base": 0, "speculative": 32, "idle": 0}
    assert demo.expected_gpus(item("a", "Probing", None)) is None


def test_the_check_passes_only_where_status_and_metrics_hold_what_the_specs_imply():
    warm = {"base": 1, "speculative": 1, "idle": 1}
    lost = {"base": 8, "speculative": 0, "idle": 0}
    items = [item("llama", "Promoted", warm), item("kimi", "RolledBack", lost, per_server=8)]
    lines, wrong = demo.gpu_report(items, demo.gpu_metrics(metrics_text(llama=warm, kimi=lost)))
    assert wrong == []
    assert lines[1].startswith("llama") and "held base 1, speculative 1, idle 1" in lines[1]

    # What the running operator reported before issue 33: every count 0. The old check ("idle 0") passed on it.
    zeros = {"base": 0, "speculative": 0, "idle": 0}
    blind = [item("llama", "Promoted", zeros), item("kimi", "RolledBack", zeros, per_server=8)]
    _, wrong = demo.gpu_report(blind, demo.gpu_metrics(metrics_text(llama=zeros, kimi=zeros)))
    assert len(wrong) == 4 and any("llama: status.gpus" in w for w in wrong)

    # A loser that was not scaled to 0: idle GPUs no spec asked for.
    kept = {"base": 8, "speculative": 8, "idle": 8}
    _, wrong = demo.gpu_report([item("kimi", "RolledBack", kept, per_server=8)], demo.gpu_metrics(metrics_text(kimi=kept)))
    assert [w.split(":")[0] for w in wrong] == ["kimi", "kimi"]

    # Status right but the metric missing, the metrics not answering, a phase that settles nothing.
    assert demo.gpu_report([item("llama", "Promoted", warm)], {})[1] == [
        "llama: specdec_gpus/specdec_idle_gpus missing, the spec implies " + str(warm)
    ]
    assert "did not answer" in demo.gpu_report([item("llama", "Promoted", warm)], None)[1][0]
    assert "settles no GPU count" in demo.gpu_report([item("llama", "Probing", warm)], {"llama": warm})[1][0]
