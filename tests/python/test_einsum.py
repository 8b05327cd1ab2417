"""qkv.einsum / qkv.einsum_path against numpy.einsum (live oracle) and opt_einsum
(live path costs), plus `qkv einsum` end to end.

The equations are those of numpy/_core/tests/test_einsum.py (sums, traces,
diagonals, broadcasting, optimize_compare cases) and the seed equations.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest

import qkv

NP_SIZES = dict(zip("abcdefghij", [2, 3, 4, 5, 4, 3, 2, 6, 5, 4]))
OPTIMIZE = [False, True, "greedy", "optimal", "dp", "branch-2"]

SEEDS = [
    ("b i k, b j k -> b i j", [(2, 5, 8), (2, 7, 8)]),
    ("b h i d, b h j d -> b h i j", [(2, 3, 9, 16), (2, 3, 11, 16)]),
    ("b h i j, b h j d -> b h i d", [(2, 3, 9, 11), (2, 3, 11, 16)]),
    ("abc,cde->abde", [(2, 2, 3), (3, 2, 4)]),
    ("aecd,abcd->acbe", [(2, 2, 2, 4), (2, 2, 2, 4)]),
    ("acbe,aecd->abcd", [(2, 2, 2, 2), (2, 2, 2, 4)]),
    ("abcd,cde->abe", [(2, 2, 2, 4), (2, 4, 3)]),
    ("abc,cd->abd", [(2, 2, 3), (3, 1)]),
    ("afgde,abcde->adbcfg", [(2, 3, 2, 4, 5), (2, 3, 2, 4, 5)]),
]
NUMPY_CASES = [
    ("i->", [(7,)]), ("i,i->", [(7,), (7,)]), ("i,i->i", [(7,), (7,)]), (",i->i", [(), (7,)]),
    ("i,->i", [(7,), ()]), (",i->", [(), (7,)]), ("i,i,i,i->", [(5,)] * 4), ("ii", [(4, 4)]),
    ("ijij->", [(3, 4, 3, 4)]), ("iij->j", [(3, 3, 5)]), ("...ii->...i", [(2, 3, 3)]),
    ("ii...->...i", [(3, 3, 2)]), ("bbcdc->d", [(1, 1, 3, 1, 3)]),
    ("ijklm,ijn,ijn->", [(5, 4, 4, 2, 3), (5, 4, 6), (5, 4, 6)]), ("x,yx,zx->xzy", [(2,), (2, 2), (4, 2)]),
    ("ij...,j...->i...", [(1, 2), (2, 2, 1)]), ("...i,...i", [(3,), (3,)]),
    ("ij...,j...->ij...", [(2, 3, 4), (3,)]), ("ij...,...j->ij...", [(2, 3, 4), (3,)]),
    ("ij...,j->ij...", [(2, 3, 4), (3,)]), ("ik...,k...->i...", [(4, 3), (3, 2)]),
    ("ik...,...kj->i...j", [(4, 3), (3, 2)]), ("...k,kj", [(4, 3), (3, 2)]), ("ik,k...->i...", [(4, 3), (3, 2)]),
    ("ijkl,k", [(2, 3, 4, 5), (4,)]), ("...kl,k", [(2, 3, 4, 5), (4,)]), ("...kl,k...", [(2, 3, 4, 5), (4,)]),
    ("...lmn,lmno->...o", [(1, 1, 1, 6, 5, 4), (6, 5, 4, 3)]), ("cl, cpx->lpx", [(2, 3), (2, 3, 7)]),
    ("ijk,kl,jl", [(1, 5, 4), (4, 6), (5, 6)]), ("ijk,kl,jl,i->i", [(1, 5, 4), (4, 6), (5, 6), (10,)]),
    ("abjk,kl,jl,ab->ab", [(1, 1, 5, 4), (4, 6), (5, 6), (7, 7)]), ("obk,ijk->ioj", [(2, 4, 8), (2, 4, 8)]),
    ("ijp,ipq,ikq->ijk", [(3, 1, 1), (3, 1, 3), (1, 3, 3)]),
    ("jhcabhijaci,dfijejgh->fgje", [(1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1), (3, 1, 3, 1, 1, 1, 1, 2)]),
    ("baegffahgc,hdggeff->dhg", [(2, 1, 4, 1, 1, 1, 1, 2, 1, 1), (1, 1, 1, 1, 4, 1, 1)]),
    ("gah,cdbcghefg->ef", [(2, 3, 1), (1, 3, 1, 1, 1, 2, 1, 4, 1)]), ("cacc,bcb->", [(1, 1, 1, 1), (1, 4, 1)]),
]
OPTIMIZE_COMPARE = [
    "a,ab,abc->abc", "a,b,ab->ab", "ea,fb,gc,hd,abcd->efgh", "ea,fb,abcd,gc,hd->efgh", "abcd,ea,fb,gc,hd->efgh",
    "acdf,jbje,gihb,hfac,gfac,gifabc,hfac", "cd,bdhe,aidb,hgca,gc,hgibcd,hgac", "abhe,hidj,jgba,hiab,gab",
    "bde,cdh,agdb,hica,ibd,hgicd,hiac", "chd,bde,agbc,hiad,hgc,hgi,hiad", "chd,bde,agbc,hiad,bdi,cgh,agdb",
    "bdhe,acad,hiab,agac,hibd", "ab,ab,c->", "ab,ab,c->c", "ab,ab,cd,cd->", "ab,ab,cd,cd->ac", "ab,ab,cd,cd->cd",
    "ab,ab,cd,cd,ef,ef->", "ab,cd,ef->abcdef", "ab,cd,ef->acdf", "ab,cd,de->abcde", "ab,cd,de->be",
    "ab,bcd,cd->abcd", "ab,bcd,cd->abd", "eb,cb,fb->cef", "dd,fb,be,cdb->cef", "bca,cdb,dbf,afc->",
    "dcc,fce,ea,dbf->ab", "fdf,cdd,ccd,afe->ae", "abcd,ad", "ed,fcd,ff,bcf->be", "baa,dcf,af,cde->be",
    "bd,db,eac->ace", "fff,fae,bef,def->abd", "efc,dbc,acf,fd->abe", "ba,ac,da->bcd", "ab,ab", "ab,ba",
    "abc,abc", "abc,bac", "abc,cba", "aab,fa,df,ecc->bde", "ecb,fef,bad,ed->ac", "bcf,bbb,fbf,fc->",
    "bb,ff,be->e", "bcb,bb,fc,fff->", "fbb,dfd,fc,fc->", "afd,ba,cc,dc->bf", "adb,bc,fa,cfc->d",
    "bbd,bda,fc,db->acf", "dba,ead,cad->bce", "aef,fbc,dca->bde",
]


def shapes_for(eq):
    return [tuple(NP_SIZES[c] for c in term) for term in eq.split("->")[0].split(",")]


def operands(shapes, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("optimize", OPTIMIZE, ids=str)
@pytest.mark.parametrize("eq,shapes", SEEDS + NUMPY_CASES + [(e, shapes_for(e)) for e in OPTIMIZE_COMPARE],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_matches_numpy_float64(eq, shapes, optimize):
    ops = operands(shapes)
    want = np.einsum(eq, *ops, optimize=optimize if optimize in (False, True, "greedy", "optimal") else True)
    got = qkv.einsum(eq, *ops, optimize=optimize)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eq,shapes", SEEDS + NUMPY_CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_matches_numpy_float32(eq, shapes):
    ops = operands(shapes, np.float32)
    want = np.einsum(eq, *[o.astype(np.float64) for o in ops], optimize=True)
    got = qkv.einsum(eq, *ops, optimize=True)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_sized_contractions():
    q, k = operands([(2, 4, 128, 64), (2, 4, 96, 64)], np.float32)
    s = qkv.einsum("b h i d, b h j d -> b h i j", q, k)
    np.testing.assert_allclose(s, np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k), rtol=1e-5, atol=1e-4)
    w = np.random.default_rng(2).random((2, 4, 128, 96)).astype(np.float32)
    v = operands([(2, 4, 96, 32)], np.float32)[0]
    np.testing.assert_allclose(qkv.einsum("bhij,bhjd->bhid", w, v), np.einsum("bhij,bhjd->bhid", w, v),
                               rtol=1e-5, atol=1e-4)


def test_views_like_numpy():
    a = np.arange(6.0).reshape(2, 3)
    for eq in ["...", "ij", "ji"]:
        assert np.shares_memory(qkv.einsum(eq, a), a)
    np.testing.assert_array_equal(qkv.einsum("ji", a), a.T)
    b = np.arange(27.0).reshape(3, 3, 3)
    for eq in ["ii->i", "...ii->...i", "ii...->...i"]:
        x = b if eq != "ii->i" else b[0]
        got = qkv.einsum(eq, x)
        assert np.shares_memory(got, x)
        np.testing.assert_array_equal(got, np.einsum(eq, x))
    np.testing.assert_array_equal(qkv.einsum(b, [0, 0, Ellipsis], [Ellipsis, 0]),
                                  np.einsum(b, [0, 0, Ellipsis], [Ellipsis, 0]))


def test_sublist_form_and_subscript_range():
    a, b = np.ones((2, 3)), np.ones((3, 4))
    for j in [20, 27, 51]:
        np.testing.assert_array_equal(qkv.einsum(a, [0, j], b, [j, 2], [0, 2]), np.full((2, 4), 3.0))
    with pytest.raises(ValueError):
        qkv.einsum(a, [0, 52], b, [52, 2], [0, 2])
    with pytest.raises(ValueError):
        qkv.einsum(a, [-1, 5], b, [5, 2], [-1, 2])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_,
                                   ml_dtypes.bfloat16], ids=str)
def test_result_dtypes(dtype):
    arr = (np.arange(7) + 0.5).astype(dtype) if dtype != np.bool_ else np.arange(7) % 2 == 0
    got = qkv.einsum("i,i->", arr, arr)
    want_dtype = np.result_type(arr, arr) if dtype != ml_dtypes.bfloat16 else ml_dtypes.bfloat16
    assert got.dtype == want_dtype
    ref = arr.astype(np.float64) if dtype != np.bool_ else arr
    np.testing.assert_allclose(np.float64(got), np.float64(np.einsum("i,i->", ref, ref)),
                               rtol=1e-2 if dtype in (np.float16, ml_dtypes.bfloat16) else 1e-12)
    assert qkv.einsum("i,j->ij", arr, arr.astype(np.float32)).dtype == np.result_type(
        arr.astype(np.float32) if dtype == ml_dtypes.bfloat16 else arr, np.float32)


def test_spaces():
    arr = np.arange(6.0).reshape(2, 3)
    for sp in itertools.product(["", " "], repeat=4):
        eq = "{}...a{}->{}...a{}".format(*sp)
        np.testing.assert_array_equal(qkv.einsum(eq, arr), np.einsum(eq, arr))
        np.testing.assert_array_equal(qkv.einsum("i{}j{},{}jk".format(*sp[:3]), arr, arr.T), arr @ arr.T)


ERRORS = [
    ("", [0, 0]), (",", [0, [0], [0]]), (",", [[0]]), ("i", [0]), ("ij", [[0, 0]]), ("...i", [0]),
    ("i...j", [[0, 0]]), ("i...", [0]), ("ij...", [[0, 0]]), ("i..", [[0, 0]]), (".i...", [[0, 0]]),
    ("j->..j", [[0, 0]]), ("j->.j...", [[0, 0]]), ("i%...", [[0, 0]]), ("...j$", [[0, 0]]), ("i->&", [[0, 0]]),
    ("i->ij", [[0, 0]]), ("ij->jij", [[[0, 0], [0, 0]]]), ("ii", [np.arange(6).reshape(2, 3)]),
    ("ii->i", [np.arange(6).reshape(2, 3)]), ("i", [np.arange(6).reshape(2, 3)]),
]


@pytest.mark.parametrize("fn", [qkv.einsum, qkv.einsum_path], ids=lambda f: f.__name__)
@pytest.mark.parametrize("optimize", [True, False], ids=str)
@pytest.mark.parametrize("eq,ops", ERRORS, ids=lambda x: repr(x) if isinstance(x, str) else "")
def test_numpy_error_cases(fn, eq, ops, optimize):
    ops = [np.asarray(o, dtype=np.float64) for o in ops]
    with pytest.raises(ValueError):
        np.einsum(eq, *ops, optimize=optimize)  # the oracle agrees that the call is invalid
    with pytest.raises(ValueError, match=r"einsum\('"):
        fn(eq, *ops, optimize=optimize)


def test_error_names_label_and_both_sizes():
    with pytest.raises(ValueError, match="'b'"):
        qkv.einsum("aabcb,abc", np.ones((3, 3, 4, 5, 6)), np.ones((3, 4, 5)))
    with pytest.raises(ValueError, match=r"size of label 'j' is 3 in operand 0 but 4 in operand 1 \(shapes \[2, 3\], \[4, 5\]\)"):
        qkv.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((4, 5)))


def test_einsum_path_like_numpy():
    ops = [np.random.rand(*s) for s in shapes_for("dcc,fce,ea,dbf->ab")]
    assert qkv.einsum_path("dcc,fce,ea,dbf->ab", *ops, optimize=False)[0] == ["einsum_path", (0, 1, 2, 3)]
    exp = ["einsum_path", (0, 2), (0, 2), (0, 1)]
    assert qkv.einsum_path("dcc,fce,ea,dbf->ab", *ops, optimize=exp)[0] == exp
    np.testing.assert_allclose(qkv.einsum("dcc,fce,ea,dbf->ab", *ops, optimize=exp),
                               np.einsum("dcc,fce,ea,dbf->ab", *ops), rtol=1e-12)
    ops2 = [np.random.rand(*s) for s in shapes_for("cab,cdd->ab")]
    exp2 = ["einsum_path", (1,), (0, 1)]
    assert qkv.einsum_path("cab,cdd->ab", *ops2, optimize=exp2)[0] == exp2
    np.testing.assert_allclose(qkv.einsum("cab,cdd->ab", *ops2, optimize=exp2), np.einsum("cab,cdd->ab", *ops2))
    bad = [np.random.rand(*s) for s in shapes_for("ab,bc,cd,de->ae")]
    with pytest.raises(ValueError, match="more operand"):
        qkv.einsum("ab,bc,cd,de->ae", *bad, optimize=["einsum_path", (2, 3), (0, 1)])
    outer = [np.random.rand(*s) for s in shapes_for("a,b,c->abc")]
    assert qkv.einsum_path("a,b,c->abc", *outer, optimize=("greedy", 1))[0] == ["einsum_path", (0, 1, 2)]
    # The report reads like numpy's.
    a, b = np.ones((2, 3)), np.ones((3, 4))
    ours, theirs = qkv.einsum_path("ij,jk", a, b)[1], np.einsum_path("ij,jk", a, b)[1]
    for line in ["Complete contraction:  ij,jk->ik", "Naive scaling:  3", "Naive FLOP count:  4.800e+01",
                 "Largest intermediate:  8.000e+00 elements"]:
        assert line in ours and line in theirs


def test_sorting_of_26_and_27_implicit_labels():
    for n, want in [(26, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"), (27, "ABCDEFGHIJKLMNOPQRSTUVWXYZa")]:
        x = np.random.random((1,) * n)
        report = qkv.einsum_path(x, list(range(n)))[1]
        assert report.split("->")[-1].strip() == want
        assert qkv.einsum(x, list(range(n))).shape == (1,) * n


@pytest.mark.parametrize("seed", range(30))
def test_optimal_cost_matches_opt_einsum(seed):
    oe = pytest.importorskip("opt_einsum")  # requirements-dev.txt; skip only this test without it
    oe_testing = pytest.importorskip("opt_einsum.testing")
    eq, shapes = oe_testing.rand_equation(3 + seed % 4, 3, n_out=seed % 3, d_min=2, d_max=6, seed=seed,
                                          global_dim=seed % 5 == 0)
    _, info = oe.contract_path(eq, *shapes, shapes=True, optimize="optimal")
    ops = [np.empty(s) for s in shapes]
    path = qkv.einsum_path(eq, *ops, optimize="optimal")[0]
    # opt_einsum prices our path: equal to its optimal, or below where its memo misleads it
    _, ours = oe.contract_path(eq, *shapes, shapes=True, optimize=[tuple(p) for p in path[1:]])
    assert ours.opt_cost <= info.opt_cost
    assert 4 * ours.opt_cost >= 3 * info.opt_cost
    ops = [np.random.default_rng(seed).standard_normal(s) for s in shapes]
    got = qkv.einsum(eq, *ops, optimize="optimal")
    np.testing.assert_allclose(got, oe.contract(eq, *ops, optimize="optimal"), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got, np.einsum(eq, *ops), rtol=1e-10, atol=1e-10)


def test_cli_matches_numpy(run, tmp_path):
    q, k = operands([(2, 3, 32, 16), (2, 3, 24, 16)], np.float32)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "k.npy", k)
    r = run("einsum", "b h i d, b h j d -> b h i j", tmp_path / "q.npy", tmp_path / "k.npy", "-o", tmp_path / "s.npy",
            "--optimize", "optimal", "--path")
    assert r.returncode == 0, r.stderr
    assert "Complete contraction:  bhid,bhjd->bhij" in r.stdout and "kernels: GEMM" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), np.einsum("bhid,bhjd->bhij", q, k), rtol=1e-5, atol=1e-5)
    bad = run("einsum", "ij,jk->ik", tmp_path / "q.npy", tmp_path / "k.npy", "-o", tmp_path / "x.npy")
    assert bad.returncode == 1 and "einsum('ij,jk->ik')" in bad.stderr


# numpy's check_einsum_sums equations, for sizes 1..16 and several dtypes (small
# integer values, so that every dtype's sums are exact and results compare equal).
SUMS = {
    "i->": lambda n: [(n,)], "...i->...": lambda n: [(2, 3, n)], "i...->...": lambda n: [(n, 2, 3)],
    "ii": lambda n: [(n, n)], "...,...": lambda n: [(2, 3, n), (2, 3, n)], "..., ...": lambda n: [(3, n), ()],
    "...i, ...i": lambda n: [(2, 3, n), (n,)], "i..., i...": lambda n: [(n, 2, 3), (n, 3)],
    "i,->": lambda n: [(n,), ()], ",i->": lambda n: [(), (n,)], "i,->i": lambda n: [(n,), ()],
    ",i->i": lambda n: [(), (n,)], "i,i": lambda n: [(n,), (n,)], "i, i": lambda n: [(n,), (n,)],
    "i,i,i->i": lambda n: [(n,)] * 3, "ij,j": lambda n: [(4, n), (n,)], "ij, j": lambda n: [(4, n), (n,)],
    "ji,j": lambda n: [(n, 4), (n,)], "ij,jk": lambda n: [(4, n), (n, 6)], "ij,jk,kl": lambda n: [(3, n), (n, 4), (4, 5)],
    "ijk, jil -> kl": lambda n: [(3, 4, n), (4, 3, 2)], "ijk,jil->kl": lambda n: [(3, 4, n), (4, 3, 2)],
    "i,j": lambda n: [(n,), (n + 1,)], "ij,i->": lambda n: [(n, 3), (n,)], "ji,i->": lambda n: [(3, n), (n,)],
    "i,ij->": lambda n: [(n,), (n, 5)], "...ij,...jk->...ik": lambda n: [(2, n, 3), (3, 4)],
}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("eq", list(SUMS))
def test_numpy_sums(eq, dtype):
    rng = np.random.default_rng(3)
    for n in range(1, 17):
        ops = [rng.integers(-3, 4, size=s).astype(dtype) for s in SUMS[eq](n)]
        for optimize in (False, True):
            want = np.einsum(eq, *ops, optimize=optimize)
            got = qkv.einsum(eq, *ops, optimize=optimize)
            assert got.dtype == want.dtype and got.shape == want.shape, (eq, n)
            np.testing.assert_array_equal(got, want, err_msg=f"{eq} n={n}")


@pytest.mark.parametrize("dtype", [np.int8, np.int32], ids=lambda d: d.__name__)
@pytest.mark.parametrize("optimize", [False, True], ids=str)
def test_integer_overflow_wraps_like_numpy(dtype, optimize):
    # numpy's integer einsum wraps modulo 2^bits; qkv sums in float64 (exact below 2^53),
    # so the result must wrap the same way, not saturate at the dtype's limits.
    rng = np.random.default_rng(5)
    hi = 128 if dtype == np.int8 else 2**20
    for eq, shapes in [("i,i", [(30,), (30,)]), ("i->", [(300,)]), ("ij,jk->ik", [(3, 40), (40, 4)]),
                       ("ij->i", [(5, 300)]), ("ii", [(200, 200)]), ("i,j->ij", [(9,), (9,)])]:
        ops = [rng.integers(-hi, hi, size=s).astype(dtype) for s in shapes]
        want = np.einsum(eq, *ops, optimize=optimize)
        got = qkv.einsum(eq, *ops, optimize=optimize)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=eq)


@pytest.mark.parametrize("limit", [1e30, 2**63, 10**30, -1e30, 599, 600, 0])
def test_memory_limit_beyond_int64_limits_nothing(limit):
    # A limit past int64 came out negative after the cast, so no pairwise step fitted.
    rng = np.random.default_rng(0)
    a, b, c = rng.random((20, 30)), rng.random((30, 40)), rng.random((40, 5))
    want = np.einsum_path("ij,jk,kl->il", a, b, c, optimize=("greedy", limit))[0]
    assert qkv.einsum_path("ij,jk,kl->il", a, b, c, optimize=("greedy", limit))[0] == want
    np.testing.assert_allclose(qkv.einsum("ij,jk,kl->il", a, b, c, optimize=("greedy", limit)), a @ b @ c)
    with pytest.raises(ValueError, match="nan"):
        qkv.einsum("ij,jk,kl->il", a, b, c, optimize=("greedy", float("nan")))


def test_optimize_none_is_false_as_in_numpy():
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(qkv.einsum("ij,jk", a, a.T, optimize=None), np.einsum("ij,jk", a, a.T, optimize=None))
    assert qkv.einsum_path("ij,jk,kl", a, a.T, a, optimize=None)[0] == \
        np.einsum_path("ij,jk,kl", a, a.T, a, optimize=None)[0]


@pytest.mark.parametrize("eq,shapes", [
    ("fd,def,cb,abfe->de", [(5, 3), (3, 4, 5), (2, 6), (7, 6, 5, 4)]),   # intermediates' labels by (size, letter)
    ("ebf,bac,ca,f,dea->d", [(2, 3, 4), (3, 5, 6), (6, 5), (4,), (7, 2, 5)]),
    ("eda,f,f->e", [(4, 2, 3), (5,), (5,)]),                               # a scalar intermediate's term is ''
    ("e,c,b->", [(2,), (3,), (4,)]),
])
def test_einsum_path_report_lines_equal_numpys(eq, shapes):
    # Same path (optimal, numpy's default memory cap given explicitly): every line of the
    # report but the FLOP counts (numpy adds 1) and the speedup is numpy's text.
    ops = [np.ones(s) for s in shapes]
    cap = max([o.size for o in ops] + [int(np.prod(np.einsum(eq, *ops).shape))])
    want_path, want = np.einsum_path(eq, *ops, optimize="optimal")
    got_path, got = qkv.einsum_path(eq, *ops, optimize=("optimal", cap))
    assert got_path == want_path
    keep = lambda report: [ln for ln in report.splitlines() if "FLOP" not in ln and "speedup" not in ln]
    assert keep(got) == keep(want)


def test_bfloat16_view_with_a_negative_stride_on_a_size_1_dim():
    # numpy calls such a view C-contiguous, so it came through as is; its copy was then
    # made from the uint16 bits and rejected as "dtype uint16 is not supported".
    from qkv import einops as qe
    base = np.arange(297.0).reshape(3, 33, 3).astype(ml_dtypes.bfloat16)
    x = base[2:1:-1, :31]                      # [1, 31, 3], strides (-198, 6, 2)
    assert x.strides[0] < 0 and x.flags.c_contiguous
    want = x.astype(np.float64)
    np.testing.assert_array_equal(qkv.einsum("abc->cba", x).astype(np.float64), np.einsum("abc->cba", want))
    np.testing.assert_allclose(qkv.einsum("abc,abc->c", x, x).astype(np.float64), np.einsum("abc,abc->c", want, want),
                               rtol=1e-2)  # the sum rounded to bfloat16
    np.testing.assert_array_equal(qe.rearrange(x, "a b c -> c (a b)").astype(np.float64), want.transpose(2, 0, 1).reshape(3, 31))
