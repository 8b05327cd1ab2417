"""`qkv rearrange / reduce / repeat / pack / unpack / parse-shape` against einops itself (live oracle).

numpy writes the input, the qkv CLI computes, numpy reads the result back and einops
computes the expected value on the same array. Error cases compare qkv's message with
the message einops raises for the same call (set elements sorted, as their order is
random in Python).
"""
import re

import numpy as np
import pytest

einops = pytest.importorskip("einops")

SEED_CASES = [
    # seed 000
    ("rearrange", "b c h w -> (b w) c h", (2, 3, 4, 5), {}),
    ("rearrange", "b t (d n) -> n b t d", (2, 4, 12), {"n": 3}),
    ("rearrange", "b t (n d) -> n b t d", (2, 4, 12), {"n": 3}),
    ("rearrange", "b t (d k) -> k b t d", (2, 4, 12), {"k": 3}),
    ("rearrange", "b t (d k h) -> k b h t d", (2, 5, 24), {"k": 3, "h": 2}),
    ("rearrange", "b h t d -> b t (h d)", (2, 3, 5, 4), {}),
    # seed 004
    ("rearrange", "batch seq (heads eachhead) -> batch seq heads eachhead", (2, 5, 12), {"heads": 4}),
    ("rearrange", "batch seq heads eachhead -> (batch heads) seq eachhead", (2, 5, 4, 3), {}),
    ("rearrange", "(batch heads) numq eachhead -> batch numq (heads eachhead)", (8, 5, 3), {"batch": 2}),
]

# einops/tests/test_ops.py: identity and equivalent patterns on a [2, 3, 4, 5, 6] input.
IDENTITY = ["...->...", "a b c d e-> a b c d e", "a b c d e ...-> ... a b c d e", "a b c d e ...-> a ... b c d e",
            "... a b c d e -> ... a b c d e", "a ... e-> a ... e", "a ... -> a ... ", "a ... c d e -> a (...) c d e"]
EQUIVALENT = ["a b c d e -> (a b) c d e", "a b ... -> (a b) ... ", "a b c d e -> a b (c d) e",
              "... c d e -> ... (c d) e", "a b c d e -> a b c d e", "... -> ... ", "a b c d e -> (a b c d e)",
              "... ->  (...)", "a b c d e -> b (c d e) a", "a b ... -> b (...) a", "a b c d e -> b (a c d) e",
              "a b ... e -> b (a ...) e"]
REDUCTION_PATTERNS = ["a b c d e -> ", " ... ->  ", "a b c d e -> (e a)", "a ... e -> (e a)", "a b c d e -> d (a e)",
                      " a b c d e ... -> d (a e) ", "a b c d e -> (a b)", " ... c d e  -> (...) "]

OPS_CASES = (
    [("rearrange", p, (2, 3, 4, 5, 6), {}) for p in IDENTITY + EQUIVALENT]
    + [("rearrange", p, (1, 2, 3, 5, 7, 11), {}) for p in [
        "a b c d e f -> a b c d e f", "b a c d e f -> a b d e f c", "a b c d e f -> f e d c b a",
        "a b c d e f -> (f e) d (c b a)", "a b c d e f -> (f e d c b a)", "a b c d e f -> a (b) (c d e) f",
        "a aa aa1 a1a1 aaaa a11 -> a aa aa1 a1a1 aaaa a11"]]
    + [("rearrange", "(f d) c (e b) a -> a b c d e f", (77, 3, 10, 1), {"b": 2, "d": 7})]
    # einops/tests/test_examples.py
    + [("rearrange", p, (10, 20, 30, 40), k) for p, k in [
        ("b c h w -> b h w c", {}), ("b c h w -> b (c h w)", {}),
        ("b (c h1 w1) h w -> b c (h h1) (w w1)", {"h1": 2, "w1": 2}),
        ("b c (h h1) (w w1) -> b (h1 w1 c) h w", {"h1": 2, "w1": 2}),
        ("b1 sound b2 letter -> b1 b2 sound letter", {}), ("b c h w -> (b h w) c", {}),
        ("b (c g) h w -> g b c h w", {"g": 2}), ("b c h w -> h (b w) c", {}),
        ("b c (h hs) (w ws) -> (hs ws b) c h w", {"hs": 2, "ws": 2})]]
    + [("rearrange", "b h w c -> b c h w", (3, 2, 4, 1), {}), ("rearrange", "a () b 1 -> (a b)", (2, 1, 3, 1), {})]
)

# einops/tests/test_ops.py repeat cases on [2, 3, 5] and anonymous-axis cases on [1, 2, 4, 6].
REPEAT_CASES = [("repeat", p, (2, 3, 5), k) for p, k in [
    ("a b c -> c a b", {}), ("a b c -> (c copy a b)", {"copy": 2, "a": 2, "b": 3, "c": 5}),
    ("a b c -> (a copy) b c ", {"copy": 1}), ("a b c -> (c a) (copy1 b copy2)", {"a": 2, "copy1": 1, "copy2": 2}),
    ("a ...  -> a ... copy", {"copy": 4}), ("... c -> ... (copy1 c copy2)", {"copy1": 1, "copy2": 2}),
    ("...  -> ... ", {}), (" ...  -> copy1 ... copy2 ", {"copy1": 2, "copy2": 3}),
    ("a b c  -> copy1 a copy2 b c () ", {"copy1": 2, "copy2": 1})]] + [
    ("repeat", p, (1, 2, 4, 6), k) for p, k in [
        ("a b c d -> c a d b", {}), ("a b c d -> (c 2 d a b)", {"a": 1, "c": 4, "d": 6}),
        ("1 b c d -> (d copy 1) 3 b c ", {"copy": 3}), ("1 ...  -> 3 ... ", {}),
        ("() ... d -> 1 (copy1 d copy2) ... ", {"copy1": 2, "copy2": 3}),
        ("1 b c d -> (1 1) (1 b) 2 c 3 d (1 1)", {})]] + [
    ("repeat", "h w -> h w c", (3, 4), {"c": 3}), ("repeat", "h w -> (repeat h) w", (3, 4), {"repeat": 2}),
    ("repeat", "h w -> (h h2) (w w2)", (3, 4), {"h2": 2, "w2": 2})]

REDUCE_CASES = [("reduce", p, (2, 3, 4, 5, 6), k, r)
                for r in ["sum", "max", "min", "mean", "prod"]
                for p, k in [(p, {}) for p in REDUCTION_PATTERNS] + [
                    ("(a1 a2) ... (e1 e2) -> ", {"a1": 1, "e2": 2}), ("a b c d e -> (e c) a", {}),
                    ("(a a2) ... -> (a2 a) ...", {"a2": 1})]] + [
    ("reduce", "b c (h h2) (w w2) -> b c h w", (2, 3, 8, 6), {"h2": 2, "w2": 2}, "max"),
    ("reduce", "b c (h1 2) (w1 2) -> b c h1 w1", (2, 3, 8, 6), {}, "max"),
    ("reduce", "b c (h1 h2) (w1 w2) -> b c h1 w1", (2, 3, 9, 8), {"h1": 3, "w1": 4}, "max"),
    ("reduce", "b c h w -> b c", (2, 3, 4, 5), {}, "mean"),
    ("reduce", "b c h w -> 1 c 1 1", (2, 3, 4, 5), {}, "mean"),
    ("reduce", "b c h w -> b c () ()", (2, 3, 4, 5), {}, "mean"),
    ("reduce", "t b c -> b c", (10, 3, 4), {}, "max"),
]


def cli_transform(run, tmp_path, op, pattern, arrays, lengths, reduction=None):
    files = []
    for i, a in enumerate(arrays):
        files.append(tmp_path / f"x{i}.npy")
        np.save(files[-1], a)
    args = [op, pattern, *([reduction] if reduction else []), *files, "-o", tmp_path / "out.npy"]
    args += [f"{k}={v}" for k, v in lengths.items()]
    return run(*args)


def einops_call(op, x, pattern, lengths, reduction=None):
    if op == "reduce":
        return einops.reduce(x, pattern, reduction, **lengths)
    return getattr(einops, op)(x, pattern, **lengths)


def check_against_einops(run, tmp_path, op, pattern, x, lengths, reduction=None):
    expected = einops_call(op, x, pattern, lengths, reduction)
    result = cli_transform(run, tmp_path, op, pattern, x if isinstance(x, list) else [x], lengths, reduction)
    assert result.returncode == 0, result.stderr
    got = np.load(tmp_path / "out.npy")
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape, got.dtype)
    if reduction in ("mean", "prod", "sum") and got.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("op,pattern,shape,lengths", SEED_CASES + OPS_CASES + REPEAT_CASES,
                         ids=lambda v: str(v) if isinstance(v, str) else None)
def test_rearrange_and_repeat_match_einops(run, tmp_path, op, pattern, shape, lengths):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check_against_einops(run, tmp_path, op, pattern, x, lengths)


@pytest.mark.parametrize("op,pattern,shape,lengths,reduction", REDUCE_CASES)
def test_reduce_matches_einops(run, tmp_path, op, pattern, shape, lengths, reduction):
    x = np.random.default_rng(1).uniform(0.5, 1.5, shape).astype(np.float64)
    check_against_einops(run, tmp_path, op, pattern, x, lengths, reduction)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.bool_])
@pytest.mark.parametrize("reduction", ["sum", "max", "min", "prod", "any", "all"])
def test_reduce_dtypes_match_einops(run, tmp_path, dtype, reduction):
    x = (np.arange(2 * 3 * 4).reshape(2, 3, 4) % 5).astype(dtype)
    check_against_einops(run, tmp_path, "reduce", "a b c -> c a", x, {}, reduction)


def test_any_all_on_booleans_match_einops(run, tmp_path):
    x = np.asarray([bin(i).count("1") % 2 == 0 for i in range(2**6)]).reshape([2] * 6)
    for reduction in ["any", "all"]:
        check_against_einops(run, tmp_path, "reduce", "a b c d e f -> a 1 c d e f", x, {}, reduction)
        check_against_einops(run, tmp_path, "reduce", "a b ... -> 1 1 ...", x, {}, reduction)


def test_list_inputs_match_einops(run, tmp_path):
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(np.int64)
    check_against_einops(run, tmp_path, "rearrange", "... -> (...)", list(x), {})
    check_against_einops(run, tmp_path, "rearrange", "b ... -> ... b", list(x), {})
    check_against_einops(run, tmp_path, "reduce", "a ... e -> (...)", list(x), {}, "min")
    check_against_einops(run, tmp_path, "repeat", "...  -> b (...)", list(x), {"b": 3})


def test_random_permutations_match_einops(run, tmp_path):
    rng = np.random.default_rng(2)
    for n_axes in range(1, 9):
        shape = tuple(rng.integers(1, 4, size=n_axes))
        perm = rng.permutation(n_axes)
        pattern = " ".join(f"x{i}" for i in range(n_axes)) + " -> " + " ".join(f"x{i}" for i in perm)
        check_against_einops(run, tmp_path, "rearrange", pattern, rng.standard_normal(shape), {})


def test_large_merge_copy_matches_einops(run, tmp_path):
    x = np.random.default_rng(3).standard_normal((3, 40, 8, 33)).astype(np.float32)
    check_against_einops(run, tmp_path, "rearrange", "b t h d -> b (d t) h", x, {})
    check_against_einops(run, tmp_path, "rearrange", "b t h d -> (d h) (b t)", x, {})


# (op, pattern, shape, lengths, reduction): every invalid case must fail as einops fails.
ERROR_CASES = [
    ("rearrange", "a (b c -> a b c", (2, 6), {}, None),          # unbalanced
    ("rearrange", "a b) -> a b", (2, 6), {}, None),
    ("rearrange", "a ((b c)) -> a b c", (2, 6), {}, None),       # nested
    ("rearrange", "a a -> a", (2, 2), {}, None),                 # duplicate
    ("rearrange", "a b -> a b b", (2, 2), {}, None),
    ("rearrange", "a-b c -> c", (2, 2), {}, None),               # unknown character
    ("rearrange", "a b$ -> a", (2, 2), {}, None),
    ("rearrange", "... a ... -> a", (2, 2), {}, None),           # ellipsis misuse
    ("rearrange", "a . b -> a b", (2, 2), {}, None),
    ("rearrange", "a b -> a b ...", (2, 2), {}, None),
    ("rearrange", "a (b ...) -> a b ...", (2, 2, 3), {}, None),
    ("rearrange", "(...) -> (...)", (1, 1, 1), {}, None),
    ("rearrange", "a b c d (...) ->  a b c ... d", (1, 1, 1, 1, 1), {}, None),
    ("rearrange", "a ...pre -> a", (2, 2), {}, None),
    ("rearrange", "a b -> a", (2, 3), {}, None),                  # identifiers on one side
    ("rearrange", "a b c -> a b", (2, 3, 4), {}, None),
    ("rearrange", "a b -> a b 2", (2, 3), {}, None),              # anonymous axes in rearrange
    ("rearrange", "a (b 2) -> a b", (2, 4), {}, None),
    ("repeat", "a b -> a b c", (2, 3), {}, None),                 # missing lengths for new axes
    ("repeat", "a b -> a b c d", (2, 3), {"c": 2}, None),
    ("repeat", "a b -> a", (2, 3), {}, None),
    ("rearrange", "a b c d -> a b c d", (2, 3, 4), {}, None),     # wrong number of dims
    ("rearrange", "a b c d ... -> a b c d ...", (2, 3), {}, None),
    ("reduce", "a b c -> a", (2, 3), {}, "sum"),
    ("rearrange", "a (b c) -> a b c", (2, 12), {"c": 5}, None),  # does not divide
    ("rearrange", "(a b) c -> a b c", (7, 2), {"a": 2}, None),
    ("rearrange", "a (b c) -> a b c", (2, 12), {}, None),        # cannot infer
    ("rearrange", "(a b c) d -> a b c d", (24, 2), {"a": 2}, None),
    ("rearrange", "a b -> b a", (2, 3), {"a": 3}, None),          # given length mismatch
    ("rearrange", "a b -> b a", (2, 3), {"c": 3}, None),          # unused length
    ("rearrange", "a b -> b a", (2, 3), {"_c": 3}, None),         # invalid length name
    ("rearrange", "a 1b -> b a", (2, 3), {}, None),               # invalid identifier
    ("rearrange", "a _b -> _b a", (2, 3), {}, None),
    ("rearrange", "a 0 -> a", (2, 3), {}, None),
    ("reduce", "a b -> a", (2, 3), {}, "median"),                 # unknown reduction
    ("reduce", "a b -> a c", (2, 3), {}, "sum"),
    ("reduce", "a b -> a 2", (2, 3), {}, "max"),
]


def normalize(message):
    """einops' message without surrounding space, with {..} set members sorted."""
    def sort_set(m):
        return "{" + ", ".join(sorted(m.group(1).split(", "))) + "}"

    lines = message.strip().split("\n")
    lines[-1] = re.sub(r"\{([^{}:]*)\}", sort_set, lines[-1])
    return "\n".join(line.strip() for line in lines)


@pytest.mark.parametrize("op,pattern,shape,lengths,reduction", ERROR_CASES)
def test_errors_match_einops_messages(run, tmp_path, op, pattern, shape, lengths, reduction):
    x = np.zeros(shape, dtype=np.float32)
    with pytest.raises(einops.EinopsError) as info:
        einops_call(op, x, pattern, lengths, reduction)
    result = cli_transform(run, tmp_path, op, pattern, [x], lengths, reduction)
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("qkv: error: "), result.stderr
    got = result.stderr[len("qkv: error: "):]
    assert f'Error while processing {reduction or op}-reduction pattern "{pattern}".' in got
    assert f"Input tensor shape: {shape}." in got
    assert normalize(got) == normalize(str(info.value))


def test_mean_of_integers_fails_like_einops(run, tmp_path):
    x = np.arange(6).reshape(2, 3)
    with pytest.raises(NotImplementedError, match="reduce_mean is not available for non-floating tensors"):
        einops.reduce(x, "a b -> a", "mean")
    result = cli_transform(run, tmp_path, "reduce", "a b -> a", [x], {}, "mean")
    assert result.returncode == 1 and "reduce_mean is not available for non-floating tensors" in result.stderr


PACK_CASES = [
    ("i j * k", [(2, 3, 5), (2, 3, 7, 5), (2, 3, 7, 9, 5)]),
    ("h w *", [(4, 5), (4, 5), (4, 5, 3)]),
    ("* h w", [(4, 5), (2, 4, 5)]),
    ("h *", [(4, 5), (4, 2, 3)]),
    ("*", [(3,), (2, 2), ()]),
]


@pytest.mark.parametrize("pattern,shapes", PACK_CASES)
def test_pack_matches_einops(run, tmp_path, pattern, shapes):
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s) for s in shapes]
    expected, ps = einops.pack(arrays, pattern)
    files = []
    for i, a in enumerate(arrays):
        files.append(tmp_path / f"p{i}.npy")
        np.save(files[-1], a)
    result = run("pack", pattern, *files, "-o", tmp_path / "packed.npy")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "packed.npy"), expected)
    assert result.stdout.strip() == str([list(s) for s in ps])


UNPACK_CASES = [[[2], [1], [2]], [[2], [1], [-1]], [[-1], [1], [2]], [[1, 2], [1, -1], [1, 1]], [[2, -1], [1, 5]],
                [[0], [5], [-1]], [[2], [3], [-1]]]
UNPACK_BAD = [[[2], [1], [1]], [[4], [1], [1]], [[2], [4], [-1]], [[-1], [1], [5]], [[2, 1], [3, -1], [1]],
              [[-1], [-1]]]


@pytest.mark.parametrize("ps", UNPACK_CASES + UNPACK_BAD)
def test_unpack_matches_einops(run, tmp_path, ps):
    x = np.random.default_rng(5).standard_normal((3, 5, 4))
    np.save(tmp_path / "x.npy", x)
    outs = [tmp_path / f"u{i}.npy" for i in range(len(ps))]
    args = ["unpack", "three * four", tmp_path / "x.npy", "--shapes", ";".join(",".join(map(str, s)) for s in ps)]
    for o in outs:
        args += ["-o", o]
    result = run(*args)
    try:
        expected = einops.unpack(x, ps, "three * four")
    except einops.EinopsError as e:
        assert result.returncode == 1
        assert str(e).split(" into requested")[0].split(" received")[0] in result.stderr
        return
    assert result.returncode == 0, result.stderr
    for o, e in zip(outs, expected):
        np.testing.assert_array_equal(np.load(o), e)


@pytest.mark.parametrize("shape,pattern", [
    ((10, 20, 30, 40), "a b c d"), ((10, 20, 30, 40), "_ _ _ hello"), ((10, 20, 30, 40), "_ _ a1 a1a111a"),
    ((10, 20), "..."), ((10,), "... a"), ((10, 20, 30), "a ..."), ((10, 20, 30, 40), " a ... b"), ((10, 40), " a ... b"),
    ((1, 2, 3, 4), "1 2 3 a"), ((10, 1, 2), "a () 2"), ((2, 3, 5, 7), "batch _ h w")])
def test_parse_shape_matches_einops(run, tmp_path, shape, pattern):
    np.save(tmp_path / "x.npy", np.zeros(shape, dtype=np.float32))
    result = run("parse-shape", pattern, tmp_path / "x.npy")
    assert result.returncode == 0, result.stderr
    assert eval(result.stdout) == einops.parse_shape(np.zeros(shape), pattern)


def test_parse_shape_of_a_safetensors_tensor_by_name(run, tmp_path):
    # FILE.safetensors:NAME as the other subcommands take it; a file of several
    # tensors without a NAME is an error, not its first tensor's shape.
    from safetensors.numpy import save_file
    arrays = {"x": np.zeros((2, 3), np.float32), "y": np.zeros((5, 7, 4), np.float32)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    for name, pattern in [("x", "a b"), ("y", "a _ c")]:
        result = run("parse-shape", pattern, f"{tmp_path / 'm.safetensors'}:{name}")
        assert result.returncode == 0, result.stderr
        assert eval(result.stdout) == einops.parse_shape(arrays[name], pattern)
    result = run("parse-shape", "a b", tmp_path / "m.safetensors")
    assert result.returncode == 1 and "holds 2 tensors (x, y); pick one" in result.stderr
    result = run("parse-shape", "a b", f"{tmp_path / 'm.safetensors'}:z")
    assert result.returncode == 1 and "no tensor named 'z'" in result.stderr


@pytest.mark.parametrize("shape,pattern", [((1, 2, 3, 4), "a b c"), ((1, 2, 3, 4), "2 a b c"),
                                           ((1, 2, 3, 4), "a b c ()"), ((1, 2, 3, 4), "a b c d e ..."),
                                           ((10, 20, 30, 40), "a a b b")])
def test_parse_shape_failures_match_einops(run, tmp_path, shape, pattern):
    with pytest.raises(RuntimeError) as info:
        einops.parse_shape(np.zeros(shape), pattern)
    np.save(tmp_path / "x.npy", np.zeros(shape, dtype=np.float32))
    result = run("parse-shape", pattern, tmp_path / "x.npy")
    assert result.returncode == 1
    assert str(info.value) in result.stderr
