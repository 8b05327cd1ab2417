"""`from qkv import einops` against einops itself (live oracle), through the Python binding.

Same cases as test_einops_cli.py (which drives the CLI), plus what only the binding shows:
views where einops returns views, list inputs, einops' exception classes and messages,
pack/unpack/parse_shape/einsum with their Python types.
"""
import numpy as np
import pytest

import qkv
import qkv.einops as qe

einops = pytest.importorskip("einops")  # required in CI: conftest.py turns this skip into a failure

from test_einops_cli import ERROR_CASES, OPS_CASES, REDUCE_CASES, REPEAT_CASES, SEED_CASES, normalize  # noqa: E402


def call(module, op, x, pattern, lengths, reduction=None):
    if op == "reduce":
        return module.reduce(x, pattern, reduction, **lengths)
    return getattr(module, op)(x, pattern, **lengths)


@pytest.mark.parametrize("op,pattern,shape,lengths", SEED_CASES + OPS_CASES + REPEAT_CASES)
def test_values_and_views_match_einops(op, pattern, shape, lengths):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = call(einops, op, x, pattern, lengths)
    got = call(qe, op, x, pattern, lengths)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    if op == "rearrange":  # a view exactly where einops (numpy) gives one
        assert np.shares_memory(got, x) == np.shares_memory(expected, x), pattern
    elif 0 in got.strides:  # repeat broadcasts as torch's expand does: read-only, like np.broadcast_to
        assert not got.flags.writeable


@pytest.mark.parametrize("op,pattern,shape,lengths,reduction", REDUCE_CASES)
def test_reductions_match_einops(op, pattern, shape, lengths, reduction):
    x = np.random.default_rng(1).uniform(0.5, 1.5, shape)
    np.testing.assert_allclose(call(qe, op, x, pattern, lengths, reduction),
                               call(einops, op, x, pattern, lengths, reduction), rtol=1e-12)


def logsumexp(x, axes):
    m = x.max(axes)
    return np.log(np.exp(x - x.max(axes, keepdims=True)).sum(axis=axes)) + m


@pytest.mark.parametrize("pattern", ["a b c d e -> ", " ... ->  ", "a b c d e -> (e a)", "a ... e -> (e a)",
                                     "a b c d e -> d (a e)", " a b c d e ... -> d (a e) ", "a b c d e -> (a b)",
                                     " ... c d e  -> (...) ", "(a a2) b c d e -> (a2 a) b () c d e"])
def test_callable_reductions_match_einops(pattern):
    """einops' test_reduction_with_callable_imperatives: a logsumexp as the reduction."""
    x = np.arange(2 * 3 * 4 * 5 * 6).reshape([2, 3, 4, 5, 6]).astype("float32")
    x /= x.max()
    lengths = {"a2": 1} if "a2" in pattern else {}
    np.testing.assert_allclose(qe.reduce(x, pattern, logsumexp, **lengths),
                               einops.reduce(x, pattern, logsumexp, **lengths), rtol=1e-6)
    np.testing.assert_allclose(qe.reduce(list(x), pattern, np.max, **lengths),
                               einops.reduce(list(x), pattern, np.max, **lengths))
    with pytest.raises(einops.EinopsError) as expected:
        einops.reduce(x, "a b c d e -> f", logsumexp)
    with pytest.raises(qe.EinopsError) as got:
        qe.reduce(x, "a b c d e -> f", logsumexp)
    assert normalize(str(got.value)) == normalize(str(expected.value))


def test_seed_split_heads_is_a_view_and_merge_copies():
    x = np.random.default_rng(2).standard_normal((2, 5, 24)).astype(np.float32)
    q, k, v = qe.rearrange(x, "b t (d k h) -> k b h t d", k=3, h=2)
    assert np.shares_memory(q, x)
    merged = qe.rearrange(q, "b h t d -> b t (h d)")
    assert not np.shares_memory(merged, x) and merged.flags.c_contiguous
    np.testing.assert_array_equal(merged, einops.rearrange(q, "b h t d -> b t (h d)"))


def test_aliases_and_exception_classes():
    assert qkv.rearrange is qe.rearrange and qkv.reduce is qe.reduce and qkv.repeat is qe.repeat
    assert issubclass(qe.EinopsError, ValueError) and issubclass(qe.EinopsError, RuntimeError)
    with pytest.raises(NotImplementedError, match="reduce_mean is not available for non-floating tensors"):
        qe.reduce(np.arange(6).reshape(2, 3), "a b -> a", "mean")
    with pytest.raises(TypeError, match="empty list"):
        qe.rearrange([], "a -> a")


def test_numpy_integer_lengths_and_lists():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(qe.rearrange(x, "a b c (d e) -> a e b c d", e=np.int64(5)),
                                  einops.rearrange(x, "a b c (d e) -> a e b c d", e=5))
    for op, pattern, lengths, reduction in [("rearrange", "... -> (...)", {}, None),
                                            ("rearrange", "b ... -> ... b", {}, None),
                                            ("reduce", "a ... e -> (...)", {}, "min"),
                                            ("repeat", "...  -> b (...)", {"b": 3}, None)]:
        np.testing.assert_array_equal(call(qe, op, list(x), pattern, lengths, reduction),
                                      call(einops, op, list(x), pattern, lengths, reduction))


@pytest.mark.parametrize("op,pattern,shape,lengths,reduction", ERROR_CASES)
def test_errors_match_einops(op, pattern, shape, lengths, reduction):
    x = np.zeros(shape, dtype=np.float32)
    with pytest.raises(einops.EinopsError) as expected:
        call(einops, op, x, pattern, lengths, reduction)
    with pytest.raises(qe.EinopsError) as got:
        call(qe, op, x, pattern, lengths, reduction)
    assert normalize(str(got.value)) == normalize(str(expected.value))


def test_list_input_error_says_input_is_list():
    with pytest.raises(qe.EinopsError, match="Input is list. Additional info: {}.\n Wrong shape"):
        qe.rearrange([np.zeros((2, 3))], "a b -> a b")


@pytest.mark.parametrize("pattern,shapes", [("i j * k", [(2, 3, 5), (2, 3, 7, 5), (2, 3, 7, 9, 5)]),
                                            ("h w *", [(4, 5), (4, 5, 3)]), ("* h w", [(4, 5), (2, 4, 5)])])
def test_pack_unpack_roundtrip_matches_einops(pattern, shapes):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in shapes]
    packed, ps = qe.pack(arrays, pattern)
    expected, eps = einops.pack(arrays, pattern)
    np.testing.assert_array_equal(packed, expected)
    assert [tuple(s) for s in ps] == [tuple(s) for s in eps]
    for a, b in zip(qe.unpack(packed, ps, pattern), einops.unpack(expected, eps, pattern)):
        np.testing.assert_array_equal(a, b)
        assert np.shares_memory(a, packed)


@pytest.mark.parametrize("ps", [[[2], [1], [1]], [[2], [4], [-1]], [[-1], [1], [5]], [[-1], [-1]]])
def test_unpack_errors_are_einops_errors(ps):
    x = np.zeros((3, 5, 4))
    with pytest.raises(einops.EinopsError):
        einops.unpack(x, ps, "a * b")
    with pytest.raises(qe.EinopsError, match="unpack"):
        qe.unpack(x, ps, "a * b")


def test_parse_shape_matches_einops():
    x = np.zeros((2, 3, 5, 7), dtype=np.uint8)  # a dtype qkv lacks: only the shape is read
    for pattern in ["batch _ h w", "a ...", "... a", "_ _ _ _", "a b c d"]:
        assert qe.parse_shape(x, pattern) == einops.parse_shape(x, pattern)
    y = np.zeros([700])
    np.testing.assert_array_equal(qe.rearrange(y, "(b c h w) -> b c h w", **qe.parse_shape(x, "b _ h w")),
                                  einops.rearrange(y, "(b c h w) -> b c h w", **einops.parse_shape(x, "b _ h w")))
    with pytest.raises(RuntimeError, match="Can't parse shape with different number of dimensions"):
        qe.parse_shape(x, "a b c")


@pytest.mark.parametrize("pattern,shapes", [
    ("b c h w, b w -> b h", [(2, 3, 4, 5), (2, 5)]),
    ("b c h w, b w, b c -> b h", [(2, 3, 40, 5), (2, 5), (2, 3)]),
    ("... one two three, three four five -> ... two five", [(32, 5, 2, 3, 4), (4, 5, 6)]),
    ("one two three ..., three four five -> two five ...", [(2, 3, 4, 32, 5), (4, 5, 6)]),
    ("first_tensor second_tensor -> first_tensor", [(5, 4)]),
    ("i i -> ", [(5, 5)]),
    (" one  two  ,  three four->two  four  ", [(2, 3), (4, 5)]),
    ("i middle i -> middle", [(5, 10, 5)]),
    ("batch head q d, batch head k d -> batch head q k", [(2, 4, 6, 8), (2, 4, 7, 8)]),
])
def test_einsum_matches_einops(pattern, shapes):
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s) for s in shapes]
    np.testing.assert_allclose(qe.einsum(*arrays, pattern), einops.einsum(*arrays, pattern), rtol=1e-10, atol=1e-12)


def test_einsum_argument_errors_match_einops():
    x = np.zeros((2, 2))
    for args in [(x,), ()]:
        with pytest.raises(ValueError, match="^`einops.einsum` takes"):
            qe.einsum(*args)
    with pytest.raises(ValueError, match="^The last argument"):
        qe.einsum(x, x)
    for pattern, fragment in [("i j -> ()", "Singleton"), ("i j -> (i j)", "Shape rearrangement"),
                              ("i 2 -> i", "Anonymous axes"), ("i j", "Einsum pattern must contain"),
                              ("i j -> k", "Unknown axis k")]:
        with pytest.raises(ValueError, match=fragment):
            qe.einsum(x, pattern)


@pytest.mark.parametrize("pattern", ["1 -> , b", "() b -> -1 c", "2 -> -1", "1 c -> a_ 2", "a 2 -> a ..",
                                     "(a b) -> 3x", "i () , j -> *"])
def test_einsum_reports_the_first_error_einops_reports(pattern):
    # einops parses every side before it rejects (), compositions or anonymous axes:
    # with two faults in one pattern, the parse error is the one reported.
    x = np.zeros((2, 2))
    with pytest.raises(Exception) as want:
        einops.einsum(x, pattern)
    with pytest.raises(ValueError) as got:
        qe.einsum(x, pattern)
    assert str(got.value) == str(want.value)


def test_random_patterns_on_strided_inputs_match_einops():
    """400 random rearrange/reduce/repeat calls on sliced, transposed, reversed inputs of every dtype."""
    rng = np.random.default_rng(7)
    dtypes = [np.float32, np.float64, np.int32, np.int64, np.int8, np.float16, np.bool_]
    for _ in range(400):
        nd = int(rng.integers(1, 6))
        shape = [int(s) for s in rng.integers(1, 5, size=nd)]
        dt = dtypes[int(rng.integers(len(dtypes)))]
        base = rng.integers(0, 100, size=[s * 2 for s in shape]).astype(dt)
        x = base[tuple(slice(None, None, 2) for _ in shape)]
        if rng.random() < 0.3:
            x = x.transpose(rng.permutation(nd))
        if rng.random() < 0.2:
            x = x[::-1]
        names = [f"ax{i}" for i in range(nd)]
        perm = [int(p) for p in rng.permutation(nd)]
        groups, i = [], 0
        while i < nd:
            k = int(rng.integers(1, nd - i + 1))
            groups.append(perm[i:i + k])
            i += k
        right = " ".join("(" + " ".join(names[j] for j in g) + ")" for g in groups)
        left = " ".join(names)
        op = ["rearrange", "reduce", "repeat"][int(rng.integers(3))]
        if op == "rearrange":
            args, kwargs = (f"{left} -> {right}",), {}
        elif op == "repeat":
            args, kwargs = (f"{left} -> {right} (r rr)",), {"r": 2, "rr": 3}
        else:
            keep = " ".join(names[j] for j in perm if rng.random() < 0.5)
            ops = ["sum", "max", "min", "prod", "any", "all"] + (["mean"] if dt in (np.float32, np.float64) else [])
            args, kwargs = (f"{left} -> {keep}", ops[int(rng.integers(len(ops)))]), {}
        with np.errstate(over="ignore"):
            expected = getattr(einops, op)(x, *args, **kwargs)
        got = getattr(qe, op)(x, *args, **kwargs)
        assert got.shape == expected.shape and got.dtype == expected.dtype, (op, args, x.shape, x.dtype)
        np.testing.assert_array_equal(got, expected, err_msg=f"{op} {args} {x.shape} {x.dtype}")


def random_einsum_case(rng):
    """A random 2- or 3-operand named-axis einsum whose sizes reach past einsum's
    DIRECT/GEMM threshold (4096 multiply-adds per pair, src/einsum/contract.cc): axis
    lengths 1-5 and 8-40, a batch axis shared by every operand, strided inputs."""
    names = ["a", "b", "c", "d", "e", "f"]
    sizes = {n: int(rng.choice([rng.integers(1, 6), rng.integers(8, 41)])) for n in names}
    n_ops = int(rng.integers(2, 4))
    terms = []
    for _ in range(n_ops):
        k = int(rng.integers(1, 4))
        terms.append(["a"] + [str(x) for x in rng.choice(names[1:], size=k, replace=False)])
    used = sorted(set(sum(terms, [])))
    out = [n for n in used if n == "a" or rng.random() < 0.4]
    arrays = []
    for t in terms:
        shape = [sizes[n] for n in t]
        base = rng.standard_normal([s * 2 for s in shape])
        x = base[tuple(slice(None, None, 2) for _ in shape)]  # strided: every stride doubled
        if rng.random() < 0.5:  # a transposed layout, read through its strides
            perm = [int(p) for p in rng.permutation(len(t))]
            x = np.ascontiguousarray(np.transpose(x, perm)).transpose(np.argsort(perm))
        arrays.append(x)
    pattern = ", ".join(" ".join(t) for t in terms) + " -> " + " ".join(out)
    return pattern, arrays, terms, out, sizes


def reaches_gemm(terms, out, sizes):
    """Whether the first pair (left to right, as optimize=False runs) has a contracted
    label and at least 2 * 4096 flops: the GEMM kernel, not DIRECT."""
    a, b = set(terms[0]), set(terms[1])
    rest = set(out).union(*[set(t) for t in terms[2:]])
    contracted = (a & b) - rest
    flops = 2 * np.prod([sizes[n] for n in a | b])
    return bool(contracted) and flops >= 2 * 4096


def test_random_einsums_across_the_gemm_threshold_match_einops():
    """300 random einsums, a fifth of them (59 with this seed) with a first pair on the GEMM
    path: a dropped batch stride or a wrong leading dimension there fails this (sizes 1-5
    alone never leave DIRECT)."""
    rng = np.random.default_rng(12)
    gemm_cases = 0
    for _ in range(300):
        pattern, arrays, terms, out, sizes = random_einsum_case(rng)
        gemm_cases += reaches_gemm(terms, out, sizes)
        want = einops.einsum(*arrays, pattern)
        np.testing.assert_allclose(qe.einsum(*arrays, pattern), want, rtol=1e-10, atol=1e-9, err_msg=pattern)
        f32 = [x.astype(np.float32) for x in arrays]
        np.testing.assert_allclose(qe.einsum(*f32, pattern), want, rtol=2e-4, atol=2e-4 * np.abs(want).max(initial=1),
                                   err_msg=pattern + " float32")
    assert gemm_cases >= 50, gemm_cases
