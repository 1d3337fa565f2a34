"""Shared pytest configuration. What the tests share lives in tests/support/ (a package, no tests in it): its
fixtures are registered here as plugins, its helpers are imported (`from tests.support.world import World`).
No test module imports another test module.

    tests/unit/     no cluster needed (`make test-unit`)
    tests/cluster/  tests marked `cluster`: a real control plane per session (tests/support/kube.py)
"""

import argparse

import pytest

pytest_plugins = [
    "tests.support.kube",  # the control plane: kube_cluster, namespace, kubectl, core_v1, custom_objects, ...
    "tests.support.operator_process",  # `operator` (specdec run as a process), `sims` (in-process simulators)
    "tests.support.operator_replicas",  # `cluster`: operator replicas that can be killed, with their simulators
]


@pytest.fixture(scope="session")
def server_parser() -> argparse.ArgumentParser:
    """SGLang's own `sglang serve` parser (the installed release's ServerArgs)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)

    # argparse exits on errors; raise instead so a rejected command line fails the test with its message.
    def error(message):
        raise AssertionError(f"SGLang's parser rejected the command line: {message}")

    parser.error = error
    return parser


LWS_FIXTURES = frozenset({"lws", "lws_controller"})  # tests/cluster/test_multinode_cluster.py, test_fleet_cluster.py


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the layout true: a test marked `cluster` lives in tests/cluster/, every other test in tests/unit/.

    Under pytest-xdist (`make test`: -n, --dist loadgroup from pyproject.toml) the tests of a module that share a
    module-scoped fixture (a trained model, an installed chart, the real node) run on one worker, so the fixture
    is made once, as in a single process. Each worker is its own session with its own control plane
    (tests/support/kube.py), so a test that restarts the API server or stops the LeaderWorkerSet controller only
    disturbs the tests of its own worker, which run one after the other.
    """
    misplaced = []
    for item in items:
        # A test that starts the LeaderWorkerSet controller needs hack/tools.sh's group lws (`make test` builds it with
        # the control plane): marked, so that `-m "not lws"` leaves it out where the group is not built.
        if LWS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.lws)
        fixtures = getattr(item, "_fixtureinfo", None)
        shared = fixtures is not None and any(d.scope == "module" for defs in fixtures.name2fixturedefs.values() for d in defs)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.path.stem))
        folder = item.path.parent.name
        cluster = item.get_closest_marker("cluster") is not None
        if folder in ("unit", "cluster") and cluster != (folder == "cluster"):
            misplaced.append(f"{item.nodeid} ({'marked' if cluster else 'not marked'} cluster)")
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder (tests/cluster/ holds exactly the tests marked cluster): " + ", ".join(misplaced[:5]))
