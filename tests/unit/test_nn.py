"""ddpbench.nn layers against finite differences in float64, deferred shapes, hooks, data."""

import numpy as np
import pytest

from ddpbench import nn
from ddpbench.data import ShardedLoader, load_dataset, teacher_student


def _f64(model):
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
        p.grad = np.zeros_like(p.data)
    return model


def _numeric_grad(fn, arr, eps=1e-6):
    g = np.zeros_like(arr)
    it = np.nditer(arr, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = arr[i]
        arr[i] = old + eps
        hi = fn()
        arr[i] = old - eps
        lo = fn()
        arr[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_backward_matches_finite_differences(name):
    rng = np.random.default_rng(0)
    if name == "mlp":
        model = nn.mlp(num_classes=4, hidden=(5,), seed=1)
        x = rng.standard_normal((6, 7))
    else:
        model = nn.cnn(num_classes=4, channels=(2, 3), seed=1)
        x = rng.standard_normal((3, 2, 5, 5))
    y = rng.integers(0, 4, len(x))
    model.forward(x.astype(np.float32))  # initialise, then switch to float64
    _f64(model)

    def loss():
        return nn.softmax_cross_entropy(model.forward(x), y)[0]

    _, d = nn.softmax_cross_entropy(model.forward(x), y)
    dx = model.backward(d)
    for p in model.parameters():
        num = _numeric_grad(loss, p.data)
        np.testing.assert_allclose(p.grad, num, rtol=1e-5, atol=1e-7, err_msg=p.name)
    np.testing.assert_allclose(dx, _numeric_grad(loss, x), rtol=1e-5, atol=1e-7)


def test_conv_matches_direct_convolution():
    rng = np.random.default_rng(2)
    conv = nn.Conv2D(3, 3, stride=2, padding=1)
    x = rng.standard_normal((2, 2, 7, 6))
    y = conv.forward(x)
    w, b = conv.weight.data, conv.bias.data
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 3, 4, 3))
    for n in range(2):
        for f in range(3):
            for i in range(4):
                for j in range(3):
                    ref[n, f, i, j] = (xp[n, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3] * w[f]).sum() + b[f]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_softmax_cross_entropy_against_float64_formula():
    logits = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]], np.float32)
    y = np.array([2, 1])
    loss, d = nn.softmax_cross_entropy(logits, y)
    z = logits.astype(np.float64)
    lse = np.log(np.exp(z[0] - 3).sum()) + 3
    assert loss == pytest.approx((lse - 3.0) + 1000.0, rel=1e-6)
    p0 = np.exp(z[0] - lse)
    np.testing.assert_allclose(d[0], p0 - np.eye(3)[2], rtol=1e-6)


def test_deferred_shape_hooks_and_layer_indices():
    model = nn.mlp(num_classes=3, hidden=(4,), seed=0, prefix="a.")
    ps = model.parameters()
    assert [p.name for p in ps] == ["a.dense0.weight", "a.dense0.bias", "a.dense1.weight",
                                    "a.dense1.bias"]
    assert [p.layer for p in ps] == [0, 0, 1, 1]
    assert ps[0].deferred and ps[0].shape == (4, 0) and not ps[0].initialised
    assert ps[1].initialised  # a bias's shape is known at construction
    seen = []
    ps[0].on_initialised(lambda p: seen.append((p.name, p.shape)))
    with pytest.raises(RuntimeError, match="initialised already"):
        ps[1].on_initialised(lambda p: None)
    order = []
    for p in ps:
        p.on_grad(lambda p: order.append(p.name))
    x = np.ones((2, 9), np.float32)
    model.forward(x)
    assert seen == [("a.dense0.weight", (4, 9))]
    model.backward(np.ones((2, 3), np.float32))
    assert order == ["a.dense1.bias", "a.dense1.weight", "a.dense0.bias", "a.dense0.weight"]
    with pytest.raises(ValueError, match="initialised for 9"):
        model.forward(np.ones((2, 5), np.float32))


def test_initial_values_depend_on_seed_not_prefix():
    a = nn.mlp(seed=3, prefix="x.")
    b = nn.mlp(seed=3)
    c = nn.mlp(seed=4)
    x = np.ones((1, 8), np.float32)
    for m in (a, b, c):
        m.forward(x)
    assert all(np.array_equal(p.data, q.data) for p, q in zip(a.parameters(), b.parameters()))
    assert not np.array_equal(a.parameters()[0].data, c.parameters()[0].data)


def test_sgd_momentum_and_validation():
    w = np.array([1.0, 2.0], np.float32)
    opt = nn.SGD(lr=0.5, momentum=0.9)
    st = opt.create_state(w)
    opt.update(w, np.array([1.0, 1.0], np.float32), st)
    opt.update(w, np.array([1.0, 1.0], np.float32), st)
    np.testing.assert_allclose(w, [1.0 - 0.5 - 0.5 * 1.9, 2.0 - 0.5 - 0.5 * 1.9], rtol=1e-6)
    with pytest.raises(ValueError, match=r"lr\n.*greater than 0"):
        nn.SGD(lr=0)
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        nn.create_model("vgg")


def test_sharded_loader_shards_are_the_global_batch():
    ds = teacher_student(n_train=100, n_test=10, seed=1)
    full = ShardedLoader(ds.x_train, ds.y_train, 30, seed=9)
    for step in (0, 1, 3):  # step 3 is in the second epoch
        parts = [ShardedLoader(ds.x_train, ds.y_train, 10, rank=r, num_workers=3,
                               seed=9).batch(step)[0] for r in range(3)]
        np.testing.assert_array_equal(np.concatenate(parts), full.batch(step)[0])
    with pytest.raises(ValueError, match="rank 3 out of range"):
        ShardedLoader(ds.x_train, ds.y_train, 10, rank=3, num_workers=3)


def test_synthetic_data_is_deterministic_and_learnable_shape():
    a, b = teacher_student(seed=2), teacher_student(seed=2)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    counts = np.bincount(a.y_train, minlength=10)
    assert counts.min() > 0  # every class occurs
    assert a.as_images().x_train.shape[1:] == (1, 8, 8)
    with pytest.raises(ValueError, match="valid datasets"):
        load_dataset("mnist")


def test_digits_needs_the_optional_extra():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"ddpbench\[digits\]"):
            load_dataset("digits")
    else:
        ds = load_dataset("digits")
        assert ds.x_train.shape[1] == 64 and len(ds.x_train) + len(ds.x_test) == 1797


@pytest.mark.gpu
def test_layers_on_cupy_match_numpy():
    from conftest import gpu_or_skip

    gpu_or_skip()
    import cupy as cp

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 4)
    cpu, gpu = nn.cnn(seed=2), nn.cnn(seed=2)
    for m, xs, ys in ((cpu, x, y), (gpu, cp.asarray(x), cp.asarray(y))):
        _, d = nn.softmax_cross_entropy(m.forward(xs), ys)
        m.backward(d)
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert isinstance(q.grad, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(q.grad), p.grad, rtol=1e-4, atol=1e-5)
