"""qkv.dist under mpiexec: ring, Ulysses and tensor-parallel attention on 1-3 ranks equal a
float64 NumPy oracle of the whole computation (tests/python/dist_worker.py runs on every rank)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qkv

WORKER = Path(__file__).with_name("dist_worker.py")


def test_qkv_is_built_with_mpi():
    # install-deps installs Open MPI and QKV_MPI=auto finds it: a build without it is a defect here.
    assert qkv.dist.available
    assert shutil.which("mpiexec"), "mpiexec (openmpi-bin) is missing"


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_every_scheme_matches_numpy_float64(ranks):
    env = _mpi_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(qkv.__file__).parent.parent), env.get("PYTHONPATH")] if p)
    run = subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, str(WORKER)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ranks"] == ranks
    assert len(result["errors"]) == 14
    for name, err in result["errors"].items():
        assert err <= 1e-5, f"{name}: {err}"


def test_arguments_one_rank_cannot_convert_fail_every_rank_at_once():
    # Rank 1's arguments fail to convert before the C++ call (not an array, a misspelt layout, a
    # state_dict entry that is not an array, is_causal not a bool): it used to raise alone while
    # rank 0 waited QKV_DIST_TIMEOUT in the call's first collective. Now every rank raises the
    # same class at once, rank 0 naming rank 1 and quoting its error (QKV_DIST_TIMEOUT is 30 s
    # here, so a rank 0 left waiting reports "no completion" instead).
    env = _mpi_env()
    env["QKV_DIST_TIMEOUT"] = "30"
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(qkv.__file__).parent.parent), env.get("PYTHONPATH")] if p)
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(WORKER), "refusals"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    reasons = {"ring": ("TypeError", "expected an array"), "ulysses": ("ValueError", "'zigag'"),
               "from_projections": ("TypeError", "o_proj.weight"), "forward": ("TypeError", "is_causal")}
    for name, (cls, reason) in reasons.items():
        (cls0, msg0), (cls1, msg1) = got[name]
        assert cls1 == cls and reason in msg1, (name, got[name])
        assert cls0 == cls, (name, got[name])
        assert "rank 1 of 2 refused the call, so rank 0 stops too; rank 1 said: " in msg0, (name, msg0)
        assert reason in msg0, (name, msg0)
    assert got["in_step"][0] > 0 and got["in_step"][0] == got["in_step"][1]


def test_a_non_mpi4py_communicator_is_a_type_error():
    with pytest.raises(TypeError, match="mpi4py"):
        qkv.dist.ring_attention([[[1.0]]], [[[1.0]]], [[[1.0]]], comm=object())


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_unshard_refuses_shards_of_the_wrong_length(layout):
    # NumPy's own positions are the oracle: the shards of both layouts on 1-5 ranks go back to x.
    x = np.arange(14 * 2).reshape(1, 14, 2)
    for size in range(1, 6):
        shards = [qkv.dist.shard_sequence(x, r, size, layout=layout) for r in range(size)]
        np.testing.assert_array_equal(qkv.dist.unshard_sequence(shards, layout=layout), x)
    # 5 + 1 rows over 2 ranks (the layout gives 3 + 3) were cut and broadcast into place
    # (rows 0-2, then row 5 three times): now a ValueError naming the rank and the lengths.
    with pytest.raises(ValueError, match="rank 0's shard is \\[1, 5, 2\\]; .* gives it 3"):
        qkv.dist.unshard_sequence([x[:, :5], x[:, 5:6]], layout=layout)
    with pytest.raises(ValueError, match="no shards"):
        qkv.dist.unshard_sequence([], layout=layout)


def _mpi_env():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", QKV_NUM_THREADS="1", QKV_DIST_TIMEOUT="60")
    return env


def _attention64(q, k, v, causal):
    sys.path.insert(0, str(WORKER.parent))
    from dist_worker import attention64
    return attention64(q, k, v, causal)


@pytest.mark.parametrize("scheme,layout,causal", [("ring", "zigzag", True), ("ring", "contiguous", False),
                                                  ("ulysses", "zigzag", True), ("heads", "contiguous", True)])
def test_cli_parallel_writes_the_whole_output_on_rank_0(tmp_path, scheme, layout, causal):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 23, 8)).astype(np.float32) for _ in range(3))
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    cmd = ["mpiexec", "-n", "3", os.environ["QKV_CLI"], "attention", "--q", str(tmp_path / "q.npy"), "--k",
           str(tmp_path / "k.npy"), "--v", str(tmp_path / "v.npy"), "--parallel", scheme, "--layout", layout,
           "-o", str(tmp_path / "o.npy")] + (["--causal"] if causal else [])
    run = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    got = np.load(tmp_path / "o.npy")
    want = _attention64(q, k, v, causal)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_cli_parallel_reads_and_writes_pre_sharded_files(tmp_path):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 4, 30, 8)).astype(np.float32) for _ in range(3))
    for r in range(2):
        for name, x in (("q", q), ("k", k), ("v", v)):
            np.save(tmp_path / f"{name}.{r}.npy", qkv.dist.shard_sequence(x, r, 2, layout="zigzag"))
    cmd = ["mpiexec", "-n", "2", os.environ["QKV_CLI"], "attention", "--q", str(tmp_path / "q.{rank}.npy"), "--k",
           str(tmp_path / "k.{rank}.npy"), "--v", str(tmp_path / "v.{rank}.npy"), "--parallel", "ring", "--layout",
           "zigzag", "--causal", "-o", str(tmp_path / "o.{rank}.npy")]
    run = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    got = qkv.dist.unshard_sequence([np.load(tmp_path / f"o.{r}.npy") for r in range(2)], layout="zigzag")
    want = _attention64(q, k, v, True)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_cli_parallel_rejects_options_it_does_not_split(tmp_path):
    run = subprocess.run([os.environ["QKV_CLI"], "attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                          "--parallel", "ring", "--variant", "window", "--window", "4", "-o", "o.npy"],
                         env=_mpi_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "--parallel: takes no --mask, --weights, --variant or --dropout" in run.stderr
