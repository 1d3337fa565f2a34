"""Shared pytest configuration. Cluster fixtures live in tests/kube.py (a plugin)."""

import argparse

import pytest

pytest_plugins = ["kube"]


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
