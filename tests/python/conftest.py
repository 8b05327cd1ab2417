import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def qkv_cli():
    """Path of the built qkv tool (make pytest sets QKV_CLI)."""
    path = os.environ.get("QKV_CLI", str(ROOT / "build" / "release" / "bin" / "qkv"))
    if not os.path.exists(path):
        pytest.fail(f"qkv CLI not found at {path}; build it with `make build` first")
    return path


@pytest.fixture()
def run(qkv_cli):
    """Runs the qkv tool; returns the CompletedProcess (never raises on exit code)."""

    def _run(*args):
        return subprocess.run([qkv_cli, *map(str, args)], capture_output=True, text=True, timeout=300)

    return _run
