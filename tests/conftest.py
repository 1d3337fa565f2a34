"""Shared pytest configuration. Cluster fixtures live in tests/kube.py (a plugin)."""

pytest_plugins = ["kube"]
