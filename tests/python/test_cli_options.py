"""The qkv tool's command line: --version, exit codes (2 usage, 1 runtime), the message
of every bad numeric option, `inspect DIR`, and line-buffered output through a pipe."""
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]

DUMMY = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "-o", "out.npy"]


def test_version_is_the_one_in_cmakelists(run):
    project = re.search(r"project\(qkv VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"qkv {project}\n"
    assert qkv.__version__ == project
    assert importlib.metadata.version("qkv") == project


@pytest.mark.parametrize("args,message", [
    (["bogus"], "'bogus' is not a subcommand of qkv (one of: attention, inspect, convert, demo, train, bench, einsum,"),
    (["bench", "bogus"], "'bogus' is not a subcommand of qkv bench (one of: attention, decode, peak)"),
    ([], "A subcommand is required"),
    (["bench"], "A subcommand is required"),
    (["einsum", "ij->ji", "x.npy", "--no-such-option"], "--no-such-option"),
    (["einsum", "ij->ji", "x.npy", "-o", "y.npy", "--optimize", "bogus"],
     "--optimize: einsum: unknown optimize option 'bogus' (expected false, true, auto, greedy,"),
])
def test_usage_errors_exit_2(run, args, message):
    result = run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("qkv: usage error: "), result.stderr
    assert message in result.stderr
    assert "Run 'qkv --help'" in result.stderr


def test_runtime_error_exits_1(run, tmp_path):
    result = run("inspect", tmp_path / "missing.npy")
    assert result.returncode == 1
    assert result.stderr.startswith("qkv: error: ") and "missing.npy" in result.stderr


BENCH = ["bench", "attention", "--min-time", "0", "--shape", "1,1,4,4"]
BAD_NUMBERS = [
    (["bench", "attention", "--shape", "a,b,c,d"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got 'a,b,c,d'"),
    (["bench", "attention", "--shape", "1,2,3"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '1,2,3'"),
    (["bench", "attention", "--shape", "1,2,3,0"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '1,2,3,0'"),
    (["bench", "attention", "--shape", "1,2,3,4,"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '1,2,3,4,'"),
    (["bench", "attention", "--shape", "1,2,3,4,5,6"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '1,2,3,4,5,6'"),
    (["bench", "attention", "--shape", "1,2,3,99999999999999999999"], "--shape: expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '1,2,3,99999999999999999999'"),
    (BENCH + ["--threads", "0"], "--threads: expected an integer in [1, 4096], got '0'"),
    (BENCH + ["--threads", "-3"], "--threads: expected an integer in [1, 4096], got '-3'"),
    (BENCH + ["--threads", "2.5"], "--threads: expected an integer in [1, 4096], got '2.5'"),
    (BENCH + ["--threads", "two"], "--threads: expected an integer in [1, 4096], got 'two'"),
    (BENCH + ["--min-time", "-1"], "--min-time: expected a finite number in [0, 86400], got '-1'"),
    (BENCH + ["--min-time", "nan"], "--min-time: expected a finite number in [0, 86400], got 'nan'"),
    (BENCH + ["--min-time", "inf"], "--min-time: expected a finite number in [0, 86400], got 'inf'"),
    (BENCH + ["--min-time", "1s"], "--min-time: expected a finite number in [0, 86400], got '1s'"),
    (BENCH + ["--min-runs", "0"], "--min-runs: expected an integer in [1, 1000000], got '0'"),
    (BENCH + ["--min-runs", "1.5"], "--min-runs: expected an integer in [1, 1000000], got '1.5'"),
    (BENCH + ["--gemm", "0"], "--gemm: expected an integer in [1, 65536], got '0'"),
    (BENCH + ["--gemm", "-2048"], "--gemm: expected an integer in [1, 65536], got '-2048'"),
    (["bench", "peak", "--threads", "0"], "--threads: expected an integer in [1, 4096], got '0'"),
    (["bench", "peak", "--min-time", "-1"], "--min-time: expected a finite number in [0, 3600], got '-1'"),
    (["bench", "peak", "--min-time", "nan"], "--min-time: expected a finite number in [0, 3600], got 'nan'"),
    (["einsum", "ij->ji", "x.npy", "--memory-limit", "-5"], "--memory-limit: expected an integer >= 1, got '-5'"),
    (["einsum", "ij->ji", "x.npy", "--memory-limit", "1e3"], "--memory-limit: expected an integer >= 1, got '1e3'"),
    (["attention", *DUMMY, "--dropout", "nan"], "--dropout: expected a finite number in [0, 1], got 'nan'"),
    (["attention", *DUMMY, "--dropout", "1.5"], "--dropout: expected a finite number in [0, 1], got '1.5'"),
    (["attention", *DUMMY, "--scale", "nan"], "--scale: expected a finite number, got 'nan'"),
    (["attention", *DUMMY, "--scale", "-inf"], "--scale: expected a finite number, got '-inf'"),
    (["attention", *DUMMY, "--seed", "-1"], "--seed: expected an integer >= 0, got '-1'"),
    (["attention", *DUMMY, "--seed", "18446744073709551616"],
     "--seed: expected an integer >= 0, got '18446744073709551616'"),
    (["convert", "a.safetensors", "b.safetensors", "--to", "keras", "--heads", "0"],
     "--heads: expected an integer in [1, 65536], got '0'"),
    (["unpack", "a * b", "x.npy", "--shapes", "2;99999999999999999999", "-o", "y.npy", "-o", "z.npy"],
     "--shapes '2;99999999999999999999': expected an integer, got '99999999999999999999'"),
    (["unpack", "a * b", "x.npy", "--shapes", "2;3-4", "-o", "y.npy", "-o", "z.npy"],
     "--shapes '2;3-4': expected an integer, got '3-4'"),
    (["unpack", "a * b", "x.npy", "--shapes", "2;a", "-o", "y.npy", "-o", "z.npy"],
     "--shapes '2;a': expected an integer, got 'a'"),
    (["unpack", "a * b", "x.npy", "--shapes", "2;1.5", "-o", "y.npy", "-o", "z.npy"],
     "--shapes '2;1.5': expected an integer, got '1.5'"),
]


@pytest.mark.parametrize("args,message", BAD_NUMBERS, ids=[m.split(":")[0] + "=" + m.rsplit("got ", 1)[1] for _, m in BAD_NUMBERS])
def test_bad_numbers_are_usage_errors_naming_the_option(qkv_cli, tmp_path, args, message):
    # Checked while parsing: nothing is read, timed or written (the files do not exist).
    started = time.monotonic()
    result = subprocess.run([qkv_cli, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("qkv: usage error: " + message), result.stderr
    assert result.stdout == ""
    assert time.monotonic() - started < 30
    assert list(tmp_path.iterdir()) == []


def test_bench_dtype_outside_the_four_is_a_usage_error(qkv_cli):
    result = subprocess.run([qkv_cli, *BENCH, "--dtype", "int8"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("qkv: usage error: --dtype: int8 not in {float32,float64,bfloat16,float16}"), \
        result.stderr


def test_good_numbers_still_pass(run, tmp_path):
    result = run(*BENCH, "--threads", "1", "--gemm", "8", "--min-runs", "3", "--json")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and '"op": "gemm", "n": 8, "threads": 1' in lines[0]
    assert '"shape": [1, 1, 4, 4]' in lines[1] and '"threads": 1' in lines[1]


def test_name_length_that_is_no_integer(run, tmp_path):
    """A malformed NAME=LENGTH is a usage error (exit 2), as a malformed --shapes or any
    numeric option (it exited 1, a runtime error); a length einops rejects stays exit 1."""
    import numpy as np
    np.save(tmp_path / "x.npy", np.ones((2, 2), np.float32))
    for value in ("abc", "99999999999999999999", "2.0"):
        result = run("repeat", "h w -> h w c", tmp_path / "x.npy", "-o", tmp_path / "y.npy", f"c={value}")
        assert result.returncode == 2, result.stderr
        assert f"qkv: usage error: expected NAME=LENGTH with an integer length, got 'c={value}'" in result.stderr
    result = run("repeat", "h w -> h w c", tmp_path / "x.npy", "-o", tmp_path / "y.npy", "c=-1")
    assert result.returncode == 1 and "Axis c has a negative length -1" in result.stderr
    result = run("repeat", "h w -> h w c", "-o", tmp_path / "y.npy", "c=3")
    assert result.returncode == 2 and "usage error: no input file given" in result.stderr


def test_input_paths_with_an_equals_sign_are_files(run, tmp_path):
    """A sweep's directory such as lr=0.1/ was read as NAME=LENGTH ('expected NAME=LENGTH
    with an integer length, got .../lr=0.1/x.npy'): an argument whose value is no integer is
    an input file when that file exists."""
    import numpy as np
    (tmp_path / "lr=0.1").mkdir()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "lr=0.1" / "x.npy", x)
    out = tmp_path / "y.npy"
    result = run("repeat", "h w -> h w c", tmp_path / "lr=0.1" / "x.npy", "-o", out, "c=2")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(out), np.repeat(x[..., None], 2, axis=2))


def test_checkpoint_prefixes_that_look_like_name_length_are_files(run, tmp_path):
    """A TF checkpoint prefix ckpt_step=1000 (a trainer's usual name) was read as the axis
    length ckpt_step = 1000, since its value is an integer, and the files were never looked
    at ('no input file given'): an argument that names an existing file or checkpoint
    prefix is a file, whatever it looks like; c=2 beside it is still a length."""
    import numpy as np
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    qkv.save(tmp_path / "ckpt_step=1000.index", {"x": x})
    out = tmp_path / "y.npy"
    for spec in ("ckpt_step=1000", "ckpt_step=1000.index"):
        result = run("repeat", "h w -> h w c", tmp_path / spec, "-o", out, "c=2")
        assert result.returncode == 0, (spec, result.stderr)
        np.testing.assert_array_equal(np.load(out), np.repeat(x[..., None], 2, axis=2))
    result = run("rearrange", "h (w c) -> h w c", tmp_path / "ckpt_step=1000", "-o", out, "c=3")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(out), x.reshape(2, 1, 3))


def test_inspect_directory_lists_candidates(run, tmp_path):
    import numpy as np
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    for f in (ROOT / "tests/fixtures/keras_tf").glob("tfkeras2_ckpt.*"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "notes.txt").write_text("not a tensor file")
    result = run("inspect", tmp_path)
    assert result.returncode == 1
    assert f"inspect: '{tmp_path}' is a directory; give one file" in result.stderr
    assert "TF checkpoint prefix (PREFIX for PREFIX.index + PREFIX.data-*)" in result.stderr
    listed = [line.strip() for line in result.stderr.splitlines()[1:]]
    assert listed == [f"{tmp_path / 'a.npy'}", f"{tmp_path / 'tfkeras2_ckpt'}  (TF checkpoint prefix)"]
    # What it lists is what inspect takes.
    assert run("inspect", tmp_path / "tfkeras2_ckpt").returncode == 0
    assert run("inspect", tmp_path / "a.npy").returncode == 0


def test_inspect_empty_directory(run, tmp_path):
    result = run("inspect", tmp_path)
    assert result.returncode == 1
    assert "is a directory" in result.stderr and "It holds none of these." in result.stderr


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_bench_reports_the_dtype_of_attention_and_gemm(qkv_cli, dtype):
    result = subprocess.run([qkv_cli, "bench", "attention", "--json", "--min-time", "0", "--shape", "1,2,128,32",
                             "--dtype", dtype, "--gemm", "128"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    gemm, attention = (json.loads(line) for line in result.stdout.splitlines())
    assert (gemm["op"], gemm["dtype"], attention["op"], attention["dtype"]) == ("gemm", dtype, "attention", dtype)
    assert attention["shape"] == [1, 2, 128, 32] and attention["gflops"] > 0 and gemm["gflops"] > 0


def test_bench_peak_reports_the_rate_threads_and_target(qkv_cli):
    """qkv bench peak (measure_fma_peak): one JSON line naming the workers, the Highway target `qkv info`
    names and that target's float32 lanes; the machine line on stderr. The rate is only a figure here."""
    info = json.loads(subprocess.run([qkv_cli, "info", "--json"], capture_output=True, text=True, check=True).stdout)
    for threads in ("1", "2"):
        result = subprocess.run([qkv_cli, "bench", "peak", "--json", "--min-time", "0", "--threads", threads],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith("Machine: "), result.stderr
        (peak,) = (json.loads(line) for line in result.stdout.splitlines())
        lanes = 16 if peak["simd_target"].startswith("AVX3") else 8 if peak["simd_target"] == "AVX2" else 4
        assert (peak["op"], peak["dtype"], peak["threads"]) == ("fma_peak", "float32", int(threads))
        assert peak["simd_target"] == info["simd_target"] and peak["lanes"] == lanes and peak["gflops"] > 0


def test_bench_shape_with_lq_and_lk(qkv_cli):
    # B,H,Lq,Lk,D: a query block over longer keys; causal GFLOP/s count sum_i min(i + 1, Lk) pairs.
    result = subprocess.run([qkv_cli, "bench", "attention", "--min-time", "0", "--shape", "1,2,16,96,8", "--shape",
                             "1,2,16,16,8", "--causal"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    long_keys, square = result.stdout.splitlines()[1:]
    assert long_keys.startswith("attention (B,H,Lq,Lk,D)=(1,2,16,96,8) causal, "), long_keys
    assert square.startswith("attention (B,H,L,D)=(1,2,16,8) causal, "), square
    result = subprocess.run([qkv_cli, "bench", "attention", "--json", "--min-time", "0", "--shape", "1,2,16,96,8"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [1, 2, 16, 96, 8]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bench_backward_reports_backward_and_forward_plus_backward(qkv_cli, dtype):
    result = subprocess.run([qkv_cli, "bench", "attention", "--json", "--min-time", "0", "--shape", "1,2,128,32",
                             "--backward", "--causal", "--dtype", dtype], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    r = json.loads(line)
    assert (r["op"], r["dtype"], r["shape"], r["causal"]) == ("attention_backward", dtype, [1, 2, 128, 32], True)
    assert 0 < r["ms"] and 0 < r["fwd_bwd_ms"] and r["gflops"] > 0


def test_bench_lines_arrive_through_a_pipe_as_printed(qkv_cli):
    # Two shapes timed >= 1 s each: the first result must arrive while the second is
    # still being timed, not when qkv exits (block-buffered output came only at exit).
    proc = subprocess.Popen([qkv_cli, "bench", "attention", "--threads", "1", "--min-time", "1",
                             "--shape", "1,1,8,8", "--shape", "1,1,16,8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        machine = proc.stdout.readline()  # "Machine: ...", before any result
        first = proc.stdout.readline()
        first_at = time.monotonic()
        rest = proc.stdout.read()  # to EOF, i.e. until qkv exits
        exit_at = time.monotonic()
        err = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert machine.startswith("Machine: ") and "; oneDNN isa: " in machine, machine
    assert first.startswith("attention (B,H,L,D)=(1,1,8,8) non-causal, 1 thread(s): "), first
    assert exit_at - first_at > 0.5, "the first line came only when qkv exited"
    assert rest.startswith("attention (B,H,L,D)=(1,1,16,8)") and len(rest.splitlines()) == 1
    assert proc.returncode == 0, err
    # Progress lines went to stderr (stdout is a pipe), one per shape, in order.
    assert err.splitlines() == ["qkv bench: [1/2] attention 1,1,8,8 ...", "qkv bench: [2/2] attention 1,1,16,8 ..."]


def test_train_seed001_prints_ten_epochs_beside_keras(qkv_cli):
    result = subprocess.run([qkv_cli, "train", "seed001"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"^ +\d+ +\d", line)]
    assert [int(r[0]) for r in rows] == list(range(1, 11))
    for epoch, qkv_loss, keras_loss, rel in rows:
        assert abs(float(qkv_loss) - float(keras_loss)) <= 1e-5 * float(keras_loss), (epoch, qkv_loss, keras_loss)
    assert float(rows[-1][1]) < float(rows[0][1])  # it learns


def test_train_seed001_takes_qkv_seed001_dir_with_a_trailing_slash(qkv_cli, tmp_path):
    # The folder written ".../seed001/" was taken for one named "" inside it, so train looked for
    # .../seed001/seed001_train and said the fixture was not found.
    env = {**os.environ, "QKV_SEED001_DIR": str(ROOT / "tests" / "fixtures" / "seed001") + "/"}
    result = subprocess.run([qkv_cli, "train", "seed001"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if re.match(r"^ +\d+ +\d", line)]) == 10


def test_attention_matmul_precision_medium_stays_within_bf16_rounding(qkv_cli, tmp_path):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 3, 40, 32)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    for precision in ("highest", "medium"):
        result = subprocess.run([qkv_cli, "attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "q.npy", "--v",
                                 tmp_path / "q.npy", "--matmul-precision", precision, "-o", tmp_path / f"{precision}.npy"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    exact, medium = np.load(tmp_path / "highest.npy"), np.load(tmp_path / "medium.npy")
    assert np.abs(medium - exact).max() <= 2.0 ** -7 * np.abs(q).max()
    bad = subprocess.run([qkv_cli, "attention", "--q", "x", "--k", "x", "--v", "x", "-o", "y", "--matmul-precision",
                          "low"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--matmul-precision: low not in {highest,high,medium}" in bad.stderr, bad.stderr


def test_convert_layer_order_must_name_the_inputs_layers(run, tmp_path):
    # tf.keras .h5 files are loaded by position: a mistyped --layer-order name was
    # ignored, leaving the layers in whatever order; now it names the layers there are.
    # The fixture (Keras-written) holds one layer, multi_head_attention.
    fixture = ROOT / "tests" / "fixtures" / "keras_tf" / "mha4.weights.h5"
    out = tmp_path / "o.h5"
    result = run("convert", fixture, out, "--to", "keras", "--format", "tf-keras-h5",
                 "--layer-order", "multi_head_attenton")
    assert result.returncode == 1, result.stdout
    assert "--layer-order names 'multi_head_attenton', which is not a layer of" in result.stderr
    assert "(its layers: multi_head_attention)" in result.stderr
    assert not out.exists()
    result = run("convert", fixture, out, "--to", "keras", "--format", "tf-keras-h5",
                 "--layer-order", "multi_head_attention")
    assert result.returncode == 0, result.stderr


def test_names_from_a_file_reach_the_terminal_without_control_characters(run, tmp_path):
    """A hostile file's tensor names held ESC sequences and newlines that `qkv inspect` and the
    'pick one' message printed raw (a recoloured screen, a broken table); now they show as
    \\xNN, C1 controls (U+009B, CSI) too, while other UTF-8 stays as it is."""
    names = ["a\nb\x1b[31mRED", "csi\u009b2J", "caf\u00e9"]
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    path = tmp_path / "evil.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(12))
    listing = run("inspect", path)
    assert listing.returncode == 0, listing.stderr
    picked = run("rearrange", "a -> a", path, "-o", tmp_path / "o.npy")
    assert picked.returncode == 1
    for text in (listing.stdout, picked.stderr):
        assert "\x1b" not in text and "\u009b" not in text
        assert "a\\x0ab\\x1b[31mRED" in text and "csi\\xc2\\x9b2J" in text and "caf\u00e9" in text
    assert len(listing.stdout.splitlines()) == 2 + len(names)


def test_convert_names_a_bad_config_file(run, tmp_path):
    """`convert --config bad.json` was refused as 'save_keras_archive: OUT.keras: config_json
    is not valid JSON', naming the output: the error names the config file, and comes before
    any output is written. A good --config goes into the archive as given."""
    seed = ROOT / "tests" / "fixtures" / "seed001" / "model.weights.h5"
    bad, out = tmp_path / "bad.json", tmp_path / "out.keras"
    bad.write_text('{"class_name": "Functional", ')
    result = run("convert", seed, out, "--to", "keras", "--config", bad)
    assert result.returncode == 1, result.stderr
    # column 30: where Python's json.loads stops too ("Expecting property name ...: line 1 column 30")
    # The .keras reader's own check and words (io::check_keras_config), the file named as the source.
    assert (f"check_keras_config: {bad}: config.json is not valid JSON: [json.exception.parse_error.101] "
            "parse error at line 1, column 30") in result.stderr
    assert "out.keras" not in result.stderr and not out.exists()
    result = run("convert", seed, out, "--to", "keras", "--config", tmp_path / "missing.json")
    assert result.returncode == 1 and f"convert: --config {tmp_path / 'missing.json'}: cannot open" in result.stderr
    good = tmp_path / "good.json"
    good.write_text('{"class_name": "Functional", "config": {}}')
    result = run("convert", seed, out, "--to", "keras", "--config", good)
    assert result.returncode == 0, result.stderr
    import zipfile
    with zipfile.ZipFile(out) as z:
        assert z.read("config.json") == good.read_bytes()


def test_convert_refuses_a_config_nested_past_the_keras_limit(run, tmp_path):
    """`convert --config` parsed the file whole with no depth limit: it now stops at the
    .keras reader's limit (1000 levels, which save_keras_archive and load_keras_archive
    hold to too), naming the file, before any output is written. 1000 levels are written.
    The check and its words are the reader's (io::check_keras_config), no longer restated."""
    seed = ROOT / "tests" / "fixtures" / "seed001" / "model.weights.h5"
    out = tmp_path / "out.keras"

    def nested(arrays):  # 4 levels around the arrays
        return '{"config": {"layers": [{"name": "a", "x": ' + "[" * arrays + "]" * arrays + "}]}}"

    for arrays in (997, 1_000_000):
        deep = tmp_path / f"deep{arrays}.json"
        deep.write_text(nested(arrays))
        result = run("convert", seed, out, "--to", "keras", "--config", deep)
        assert result.returncode == 1, result.stderr
        assert (f"check_keras_config: {deep}: config.json nests JSON 1001 levels deep, more than the 1000 "
                "qkv reads (Python's json, which Keras reads it with, refuses about 1000)") in result.stderr
        assert "out.keras" not in result.stderr and not out.exists()
    ok = tmp_path / "ok.json"
    ok.write_text(nested(996))
    result = run("convert", seed, out, "--to", "keras", "--config", ok)
    assert result.returncode == 0, result.stderr
    import zipfile
    with zipfile.ZipFile(out) as z:
        assert z.read("config.json") == ok.read_bytes()


SEED001 = ROOT / "tests" / "fixtures" / "seed001"
ORDER = ["--layer-order", "multi_head_attention,dense"]
IGNORED_OPTIONS = [  # (input, OUT, options, message with {out} / {config}): each was ignored without a word
    ("model.weights.h5", "o.safetensors", ["--config", "{config}"], "--config applies to a .keras output only; {out} is safetensors"),
    ("model.weights.h5", "o.weights.h5", ["--config", "{config}"], "--config applies to a .keras output only; {out} is keras3-h5"),
    ("model.weights.h5", "o.h5", ["--config", "{config}"], "--config applies to a .keras output only; {out} is tf-keras-h5"),
    ("model.weights.h5", "ckpt", ["--config", "{config}"], "--config applies to a .keras output only; {out} is tf-checkpoint"),
    ("model.weights.h5", "o.keras", ["--config", "{config}", "--format", "safetensors"],
     "--config applies to a .keras output only; {out} is safetensors"),
    ("model.weights.h5", "o.safetensors", ORDER,
     "--layer-order applies to a tf.keras .h5, a TF checkpoint or a .keras output only; {out} is safetensors"),
    ("model.weights.h5", "o.weights.h5", ORDER,
     "--layer-order applies to a tf.keras .h5, a TF checkpoint or a .keras output only; {out} is keras3-h5"),
    ("ckpt", "ckpt", ORDER + ["--to", "same"], "--layer-order applies to --to keras only, not --to same"),
    ("model.weights.h5", "o.keras", ORDER + ["--config", "{config}"],
     "--layer-order and --config: {out} takes the layers and their order of --config {config}; give one of them"),
    ("model.keras", "o.keras", ORDER, "--layer-order does not apply: {out} takes the config.json of {input}"),
    ("model.keras", "o.keras", ["--config", "{config}", "--to", "same"], "--config applies to --to keras only, not --to same"),
    ("model.weights.h5", "o.keras", ["--config", "{config}", "--to", "torch"],
     "--config applies to --to keras only, not --to torch"),
    ("model.weights.h5", "o.safetensors", ["--heads", "2", "--to", "torch"],
     "--heads applies to --to keras only (PyTorch weights to Keras' [E, N, H] kernels), not --to torch"),
    ("ckpt", "ckpt", ["--heads", "2", "--to", "same"],
     "--heads applies to --to keras only (PyTorch weights to Keras' [E, N, H] kernels), not --to same"),
]


@pytest.mark.parametrize("source,name,options,message", IGNORED_OPTIONS,
                         ids=[f"{o[0].lstrip('-')}-{n}-{i}" for i, (_, n, o, _) in enumerate(IGNORED_OPTIONS)])
def test_convert_options_that_would_be_ignored_are_usage_errors(run, tmp_path, source, name, options, message):
    """--config (a .keras output's config.json) and --layer-order (tf.keras .h5, TF checkpoint, a .keras
    config built from the layers) were dropped without a word for other outputs; every case here wrote
    OUT and exited 0. Now a usage error naming the option, OUT and its format, before anything is read
    or written."""
    config, out, source = tmp_path / "c.json", tmp_path / name, SEED001 / source
    config.write_text('{"class_name": "Functional", "config": {}}')
    fill = {"config": config, "out": out, "input": source}
    to = [] if "--to" in options else ["--to", "keras"]
    result = run("convert", source, out, *to, *[o.format(**fill) for o in options])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("qkv: usage error: convert: " + message.format(**fill)), result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_convert_heads_from_keras_weights_is_an_error(run, tmp_path):
    # --heads splits PyTorch's in_proj into Keras' [E, N, H] kernels; from Keras weights it went unread.
    result = run("convert", SEED001 / "model.weights.h5", tmp_path / "o.h5", "--to", "keras", "--heads", "3")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "convert: --heads applies to PyTorch weights; " in result.stderr and "holds Keras weights" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_convert_layer_order_still_orders_what_it_can(run, tmp_path):
    # The outputs --layer-order applies to: a TF checkpoint, and a .keras whose config is built from the layers.
    seed = SEED001 / "model.weights.h5"
    assert run("convert", seed, tmp_path / "ckpt", "--to", "keras", *ORDER).returncode == 0
    result = run("convert", seed, tmp_path / "o.keras", "--to", "keras", *ORDER)
    assert result.returncode == 0, result.stderr
    import zipfile
    with zipfile.ZipFile(tmp_path / "o.keras") as z:
        layers = [layer["name"] for layer in json.loads(z.read("config.json"))["config"]["layers"]]
    assert layers[1:] == ["multi_head_attention", "dense"], layers


def test_an_output_directory_is_named_as_one(run, tmp_path):
    """`-o DIR` said "save: DIR: unknown file extension ''" (and convert took DIR for a TF
    checkpoint prefix, writing DIR.index beside it): a directory is an error saying so."""
    np.save(tmp_path / "x.npy", np.ones((2, 2), np.float32))
    out = tmp_path / "out"
    out.mkdir()
    result = run("rearrange", "a b -> b a", tmp_path / "x.npy", "-o", out)
    assert result.returncode == 1 and f"save: {out}: is a directory, not a file" in result.stderr, result.stderr
    result = run("heatmap", tmp_path / "x.npy", "-o", out)
    assert result.returncode == 1 and f"write_png: {out}: is a directory, not a file" in result.stderr, result.stderr
    result = run("convert", ROOT / "tests" / "fixtures" / "seed001" / "model.weights.h5", out, "--to", "same")
    assert result.returncode == 1 and f"convert: {out} is a directory, not a file" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "x.npy"] and not any(out.iterdir())


def test_a_failed_write_leaves_the_previous_output_whole(qkv_cli, tmp_path):
    """The writers wrote in place: a write that failed part way (a full disk; here the
    file size limit, `ulimit -f`) left the previous output truncated. Now the new file is
    written beside it and renamed over it only when whole."""
    import resource
    import signal
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
    np.save(tmp_path / "x.npy", x)
    for name in ("y.npy", "y.safetensors", "y.weights.h5"):
        out = tmp_path / name
        good = subprocess.run([qkv_cli, "rearrange", "a b -> b a", tmp_path / "x.npy", "-o", out])
        assert good.returncode == 0
        before = out.read_bytes()

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

        result = subprocess.run([qkv_cli, "rearrange", "a b -> (b a)", tmp_path / "x.npy", "-o", out],
                                preexec_fn=limit, capture_output=True, text=True)
        assert result.returncode == 1 and f"{out}" in result.stderr, result.stderr
        assert out.read_bytes() == before, name
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to run the tool as nobody")
def test_a_writable_file_in_a_directory_we_may_not_write_is_written_in_place(qkv_cli, tmp_path):
    """The temporary file of a whole-or-nothing write goes beside the output; where the
    directory refuses it but the file itself may be written, the file is written in place,
    as before ('cannot open for writing: Permission denied' otherwise); a file that may
    not be written stays refused. Run as nobody (uid 65534) through preexec_fn."""
    import tempfile
    base = pathlib.Path(tempfile.mkdtemp(prefix="qkv_perm_"))
    try:
        base.chmod(0o755)  # root's: nobody may not create files in it
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.save(base / "x.npy", x)
        (base / "x.npy").chmod(0o644)
        out, locked = base / "y.npy", base / "locked.npy"
        for f in (out, locked):
            np.save(f, np.zeros(1, np.float32))
        os.chown(out, 65534, 65534)

        def as_nobody():
            os.setgid(65534)
            os.setuid(65534)

        def cli(target):
            return subprocess.run([qkv_cli, "rearrange", "a b -> b a", base / "x.npy", "-o", target],
                                  preexec_fn=as_nobody, capture_output=True, text=True)

        result = cli(out)
        assert result.returncode == 0, result.stderr
        np.testing.assert_array_equal(np.load(out), x.T)
        result = cli(locked)
        assert result.returncode == 1 and "cannot open for writing: Permission denied" in result.stderr
        np.testing.assert_array_equal(np.load(locked), np.zeros(1, np.float32))
    finally:
        shutil.rmtree(base)
