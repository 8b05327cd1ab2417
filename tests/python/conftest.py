import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pytest_configure(config):
    # GPU tests (tests/python/test_cuda.py): `make pytest` deselects them (-m "not cuda"), the
    # device machine selects them (-m cuda), where they fail rather than skip without a GPU.
    config.addinivalue_line("markers", "cuda: needs a GPU, qkv's CUDA backend and torch with CUDA (pytest -m cuda)")


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


# The light oracles the suite compares against (requirements-dev.txt). A test that
# importorskips one of them is skipped where it is missing; in CI (CI=true) such a skip
# would count an oracle-less run as passing, so it is reported as a failure instead.
REQUIRED_ORACLES = ("numpy", "einops", "opt_einsum", "ml_dtypes", "safetensors")


def _missing_required_oracle(report):
    if not report.skipped or os.environ.get("CI") != "true":
        return None
    reason = str(report.longrepr)
    return next((m for m in REQUIRED_ORACLES if f"could not import '{m}" in reason), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    missing = _missing_required_oracle(report)
    if missing:
        report.outcome = "failed"
        report.longrepr = f"CI=true: the oracle {missing} must be installed (requirements-dev.txt), not skipped"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    missing = _missing_required_oracle(report)
    if missing:  # a module-level importorskip skips the whole file
        report.outcome = "failed"
        report.longrepr = f"CI=true: the oracle {missing} must be installed (requirements-dev.txt), not skipped"
