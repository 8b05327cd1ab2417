"""qkv.plot: the PNG decoded by a standard-library reader (zlib + struct, written here) equals the
returned image; colors and mask patterns against their definitions."""
import struct
import zlib

import numpy as np
import pytest

import qkv


def decode_png(path):
    """8-bit RGB, non-interlaced PNG -> uint8 [h, w, 3] (all five row filters)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, color, interlace) == (8, 2, 0)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), width * 3
    out = np.zeros((height, stride), np.int32)
    for y in range(height):
        f, row = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        prev = out[y - 1] if y else np.zeros(stride, np.int32)
        for x in range(stride):
            a = out[y, x - 3] if x >= 3 else 0
            b, c = prev[x], (prev[x - 3] if x >= 3 else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            paeth = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            pred = [0, a, b, (a + b) // 2, paeth][f]
            out[y, x] = (row[x] + pred) & 255
    return out.reshape(height, width, 3).astype(np.uint8)


def test_png_on_disk_is_the_returned_image(tmp_path):
    w = np.random.default_rng(0).random((2, 3, 9, 12))
    img = qkv.plot.heatmap(w, tmp_path / "w.png", tokens=[f"t{i}" for i in range(9)],
                           key_tokens=[chr(97 + j) for j in range(12)])
    np.testing.assert_array_equal(decode_png(tmp_path / "w.png"), img)


def test_cells_have_viridis_colors_of_their_values():
    w = np.array([[0.0, 0.5], [1.0, np.nan]])
    img = qkv.plot.heatmap(w, cell=3, labels=False)
    assert img.shape == (6, 6, 3)
    np.testing.assert_array_equal(img[0, 0], [68, 1, 84])       # matplotlib viridis(0)   #440154
    np.testing.assert_array_equal(img[0, 3], [33, 145, 140])    # viridis(0.5)            #21918c
    np.testing.assert_array_equal(img[5, 0], [253, 231, 37])    # viridis(1)              #fde725
    np.testing.assert_array_equal(img[5, 5], [255, 0, 0])       # NaN
    one_head = qkv.plot.heatmap(np.stack([w * 0, w]), index=1, cell=3, labels=False)
    np.testing.assert_array_equal(one_head, img)


def test_mask_pattern_is_the_definition():
    i, j = np.arange(20)[:, None], np.arange(20)[None, :]
    np.testing.assert_array_equal(qkv.plot.mask_pattern(qkv.AttentionMods.sliding_window(3, 1), 20),
                                  (j >= i - 3) & (j <= i + 1))
    np.testing.assert_array_equal(qkv.plot.mask_pattern(qkv.AttentionMods.causal("bottom_right"), 5, 8),
                                  np.arange(8)[None, :] <= np.arange(5)[:, None] + 3)


def test_errors():
    with pytest.raises(ValueError, match="heatmap: 2 labels for 3 queries"):
        qkv.plot.heatmap(np.zeros((3, 3)), tokens=["a", "b"])
    with pytest.raises(ValueError, match=r"heatmap: weights must be \[..., Lq, Lk\]"):
        qkv.plot.heatmap(np.zeros(3))


def test_cli_heatmap_writes_the_same_image(run, tmp_path):
    w = np.random.default_rng(1).random((2, 6, 6)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    result = run("heatmap", tmp_path / "w.npy", "-o", tmp_path / "w.png", "--index", "1", "--tokens", "a,b,c,d,e,f")
    assert result.returncode == 0, result.stderr
    want = qkv.plot.heatmap(w, index=1, tokens=list("abcdef"))
    np.testing.assert_array_equal(decode_png(tmp_path / "w.png"), want)
    bad = run("heatmap", tmp_path / "w.npy", "-o", tmp_path / "x.png", "--index", "5")
    assert bad.returncode == 1 and "heatmap: index 5 is outside the 2 [Lq, Lk] slices of [2, 6, 6]" in bad.stderr


def test_png_goes_to_a_png_name(run, tmp_path):
    # heatmap -o w.npy wrote PNG bytes under a .npy name (np.load then refuses the file)
    w = np.eye(3, dtype=np.float32)
    np.save(tmp_path / "w.npy", w)
    bad = run("heatmap", tmp_path / "w.npy", "-o", tmp_path / "out.npy")
    assert bad.returncode == 1 and "a PNG image goes to a .png file" in bad.stderr and "not .npy" in bad.stderr
    assert not (tmp_path / "out.npy").exists()
    with pytest.raises(ValueError, match="a PNG image goes to a .png file"):
        qkv.plot.heatmap(w, tmp_path / "w.jpg")
    for name in ("w.PNG", "w"):  # any case; no extension is PNG, as matplotlib takes it
        img = qkv.plot.heatmap(w, tmp_path / name, cell=2, labels=False)
        np.testing.assert_array_equal(decode_png(tmp_path / name), img)
