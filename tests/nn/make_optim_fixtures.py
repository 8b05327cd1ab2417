#!/usr/bin/env python3
"""Writes the optimizer and loss fixtures for qkv::nn's training pieces (issue 15 item 3).

Usage: KERAS_BACKEND=jax make_optim_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Optimizers: every configuration starts from the same float32 parameters (w [4, 3],
b [3]) and applies 5 steps of the same float32 gradients; OUTPUT_DIR/<name>.safetensors
holds w0, b0, the gradients gw [5, 4, 3], gb [5, 3], and the parameters after each
step, w [5, 4, 3], b [5, 3], as PyTorch's torch.optim (p.grad set, opt.step()) or Keras
3's keras.optimizers (apply_gradients) computed them. `__metadata__` "options" (one key:
safetensors orders several differently per run) names the framework and its arguments.
The *_f64 files (TORCH_F64) are torch's steps of the same values as float64 parameters and
gradients (torch keeps a parameter's dtype; their options name "dtype": "float64").

Losses: losses.safetensors holds, per loss, the inputs, PyTorch's value (mean reduction)
and its autograd gradient with respect to the first input: bce_* (binary_cross_entropy_with
_logits), ce_* (cross_entropy over [N, C] logits and int64 targets), mse_* (mse_loss), and
clip_* (torch.nn.utils.clip_grad_norm_ of two gradients with max_norm 1.0: their total norm
before clipping and the clipped gradients), <loss>_empty_loss / _grad for inputs with no
element (NaN and an empty gradient), ce_ignore_* (targets with torch's default ignore_index
-100 among them) and ce_all_ignored_* (every target -100: NaN, gradient 0), and bce_inf_*:
logits {-inf, +inf, nan} x targets {0, 0.5, 1}, each element's loss and gradient as a loss of
its own (reduction='none'). A rerun writes byte-identical files.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

STEPS = 5
TORCH = [
    ("torch_sgd", "SGD", dict(lr=0.1)),
    ("torch_sgd_momentum", "SGD", dict(lr=0.1, momentum=0.9)),
    ("torch_sgd_dampening_wd", "SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("torch_sgd_nesterov", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("torch_adam", "Adam", dict(lr=0.01)),
    ("torch_adam_wd", "Adam", dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01)),
    ("torch_adamw", "AdamW", dict(lr=0.01, weight_decay=0.01)),
]
TORCH_F64 = [
    ("torch_sgd_nesterov_f64", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("torch_adam_wd_f64", "Adam", dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01)),
]
KERAS = [
    ("keras_sgd", "SGD", dict(learning_rate=0.1)),
    ("keras_sgd_momentum", "SGD", dict(learning_rate=0.1, momentum=0.9)),
    ("keras_sgd_nesterov", "SGD", dict(learning_rate=0.1, momentum=0.9, nesterov=True)),
    ("keras_adam", "Adam", dict(learning_rate=0.01)),
    ("keras_adam_eps", "Adam", dict(learning_rate=0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-3)),
    ("keras_adamw", "AdamW", dict(learning_rate=0.01, weight_decay=0.01)),
]


def inputs():
    rng = np.random.default_rng(20261125)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float32)
    gw = rng.standard_normal((STEPS, 4, 3)).astype(np.float32)
    gb = rng.standard_normal((STEPS, 3)).astype(np.float32)
    return w0, b0, gw, gb


def run_torch(kind, kwargs, w0, b0, gw, gb):
    """Steps in w0's dtype (float32, or float64 for TORCH_F64), as torch steps any parameter."""
    w, b = torch.nn.Parameter(torch.from_numpy(w0.copy())), torch.nn.Parameter(torch.from_numpy(b0.copy()))
    opt = getattr(torch.optim, kind)([w, b], **kwargs)
    ws, bs = [], []
    for t in range(STEPS):
        w.grad, b.grad = torch.from_numpy(gw[t].copy()), torch.from_numpy(gb[t].copy())
        opt.step()
        ws.append(w.detach().numpy().copy())
        bs.append(b.detach().numpy().copy())
    return np.stack(ws), np.stack(bs)


def run_keras(kind, kwargs, w0, b0, gw, gb):
    import keras

    w, b = keras.Variable(w0.copy(), name="w"), keras.Variable(b0.copy(), name="b")
    opt = getattr(keras.optimizers, kind)(**kwargs)
    ws, bs = [], []
    for t in range(STEPS):
        opt.apply_gradients([(gw[t], w), (gb[t], b)])
        ws.append(np.asarray(w.value).copy())
        bs.append(np.asarray(b.value).copy())
    return np.stack(ws), np.stack(bs)


def write_optimizers(out_dir):
    w0, b0, gw, gb = inputs()
    rows = []
    for framework, configs, run in (("torch", TORCH, run_torch), ("keras", KERAS, run_keras)):
        for name, kind, kwargs in configs:
            ws, bs = run(kind, kwargs, w0, b0, gw, gb)
            options = {"framework": framework, "optimizer": kind, "args": kwargs}
            save_file({"w0": w0, "b0": b0, "gw": gw, "gb": gb, "w": ws, "b": bs},
                      os.path.join(out_dir, name + ".safetensors"), metadata={"options": json.dumps(options)})
            rows.append((name, framework, kind, kwargs))
    f64 = [x.astype(np.float64) for x in (w0, b0, gw, gb)]
    for name, kind, kwargs in TORCH_F64:
        ws, bs = run_torch(kind, kwargs, *f64)
        options = {"framework": "torch", "optimizer": kind, "args": kwargs, "dtype": "float64"}
        save_file({"w0": f64[0], "b0": f64[1], "gw": f64[2], "gb": f64[3], "w": ws, "b": bs},
                  os.path.join(out_dir, name + ".safetensors"), metadata={"options": json.dumps(options)})
        rows.append((name, "torch (float64)", kind, kwargs))
    return rows


def grad_of(fn, *xs):
    ts = [torch.from_numpy(x.copy()).requires_grad_(i == 0) for i, x in enumerate(xs)]
    loss = fn(*ts)
    loss.backward()
    return np.float64(loss.item()), ts[0].grad.numpy().copy()


def write_losses(out_dir):
    import torch.nn.functional as F

    rng = np.random.default_rng(7)
    t = {}
    logits = (3 * rng.standard_normal((6, 5))).astype(np.float32)
    targets = rng.integers(0, 2, (6, 5)).astype(np.float32)
    value, grad = grad_of(F.binary_cross_entropy_with_logits, logits, targets)
    t.update(bce_logits=logits, bce_targets=targets, bce_loss=np.array([value]), bce_grad=grad)
    ce_logits = (2 * rng.standard_normal((7, 4))).astype(np.float32)
    ce_targets = rng.integers(0, 4, 7).astype(np.int64)
    value, grad = grad_of(lambda x, y: F.cross_entropy(x, y), ce_logits, ce_targets)
    t.update(ce_logits=ce_logits, ce_targets=ce_targets, ce_loss=np.array([value]), ce_grad=grad)
    x, y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    value, grad = grad_of(F.mse_loss, x, y)
    t.update(mse_input=x, mse_target=y, mse_loss=np.array([value]), mse_grad=grad)
    g1, g2 = (torch.from_numpy((2 * rng.standard_normal(s)).astype(np.float32)) for s in ((4, 3), (3,)))
    p1, p2 = torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(3))
    p1.grad, p2.grad = g1.clone(), g2.clone()
    norm = torch.nn.utils.clip_grad_norm_([p1, p2], max_norm=1.0)
    t.update(clip_g1=g1.numpy(), clip_g2=g2.numpy(), clip_norm=np.array([norm.item()]),
             clip_out1=p1.grad.numpy().copy(), clip_out2=p2.grad.numpy().copy())
    # Empty inputs: torch's mean over no elements is NaN, its gradient an empty tensor.
    for name, fn, x, y in (("bce", F.binary_cross_entropy_with_logits, np.zeros((0, 3), np.float32),
                            np.zeros((0, 3), np.float32)),
                           ("ce", lambda x, y: F.cross_entropy(x, y), np.zeros((0, 4), np.float32),
                            np.zeros(0, np.int64)),
                           ("mse", F.mse_loss, np.zeros(0, np.float32), np.zeros(0, np.float32))):
        value, grad = grad_of(fn, x, y)
        t[f"{name}_empty_loss"], t[f"{name}_empty_grad"] = np.array([value]), grad
    write_ignore_and_inf(t)
    save_file(t, os.path.join(out_dir, "losses.safetensors"))


def write_ignore_and_inf(t):
    """cross_entropy's ignore_index (default -100) and BCE with logits at infinite logits."""
    import torch.nn.functional as F

    rng = np.random.default_rng(8)  # its own stream: the keys above keep their values
    x = (2 * rng.standard_normal((6, 4))).astype(np.float32)
    y = np.array([2, -100, 0, 3, -100, 1], np.int64)
    value, grad = grad_of(lambda a, b: F.cross_entropy(a, b), x, y)
    t.update(ce_ignore_logits=x, ce_ignore_targets=y, ce_ignore_loss=np.array([value]), ce_ignore_grad=grad)
    value, grad = grad_of(lambda a, b: F.cross_entropy(a, b), x[:3], np.full(3, -100, np.int64))
    t.update(ce_all_ignored_loss=np.array([value]), ce_all_ignored_grad=grad)
    xs = np.repeat(np.array([-np.inf, np.inf, np.nan], np.float32), 3)
    ys = np.tile(np.array([0.0, 0.5, 1.0], np.float32), 3)
    losses, grads = zip(*(grad_of(F.binary_cross_entropy_with_logits, xs[i:i + 1], ys[i:i + 1]) for i in range(9)))
    t.update(bce_inf_logits=xs, bce_inf_targets=ys, bce_inf_loss=np.array(losses),
             bce_inf_grad=np.concatenate(grads))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    rows = write_optimizers(out_dir)
    write_losses(out_dir)
    import keras

    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(f"# Optimizer and loss fixtures (tests/nn/make_optim_fixtures.py; torch {torch.__version__}, "
                f"keras {keras.__version__})\n\n| file | framework | optimizer | arguments |\n|---|---|---|---|\n")
        for name, framework, kind, kwargs in rows:
            f.write(f"| {name} | {framework} | {kind} | {kwargs} |\n")
        f.write("| losses | torch | — | bce / cross_entropy / mse values and gradients, clip_grad_norm_, "
                "ignore_index -100, BCE at infinite logits |\n")
    print(f"wrote {len(rows)} optimizer fixtures and losses.safetensors to {out_dir}")


if __name__ == "__main__":
    main()
