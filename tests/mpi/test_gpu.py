"""GPU path: CuPy tensors, NCCL, the fused scale kernel. Skips without a GPU (with the
reason) and fails instead when DDPBENCH_TEST_GPU=1 says a GPU is present."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import gpu_or_skip
from mpiutil import REPO, SCRIPTS, one, results, run_mpi


def test_without_cupy_import_is_clean_and_use_says_what_to_install(monkeypatch):
    from ddpbench import gpu

    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    assert gpu.is_available() is False
    assert gpu.is_device_array(np.ones(2)) is False
    with pytest.raises(ImportError, match=r"pip install 'ddpbench\[gpu\]'"):
        gpu.cupy_or_raise()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("half_rule", ["half", "float"])
def test_fused_scale_kernel_matches_horovods_rules(dtype, half_rule):
    """fp16 under "half" is Horovod's CUDA kernel (numerics.scale's "gpu" rule, itself pinned
    against an element-wise kernel emulation); everything else is the CPU rule's bits."""
    gpu_or_skip()
    import cupy

    from ddpbench import gpu
    from ddpbench.numerics import scale

    host = (np.random.default_rng(1).standard_normal(100_003) * 300).astype(dtype)
    rule = "gpu" if (dtype == "float16" and half_rule == "half") else "cpu"
    for factor in (0.125, 1 / 3, 1 / 6, 7.0, 1e-4, 3e-8):
        src = cupy.asarray(host)
        dst = cupy.empty_like(src)
        gpu.scale_copy(src, dst, factor, half_rule)
        want = scale(host.copy(), factor, scaling=rule)
        assert np.array_equal(cupy.asnumpy(dst).view(np.uint8), want.view(np.uint8)), factor
    if dtype == "float16":  # all 65,536 bit patterns at a factor the rules round apart
        every = np.arange(65536, dtype=np.uint16).view(np.float16)
        out = cupy.empty(every.size, np.float16)
        gpu.scale_copy(cupy.asarray(every), out, 1 / 3, half_rule)
        want = scale(every.copy(), 1 / 3, scaling=rule)
        got = cupy.asnumpy(out)
        # NaN in, NaN out: the GPU answers its canonical NaN where the CPU keeps the payload
        # and sign (seen on an H200: 0x7fff for 0xfffd..0xffff); every other pattern bit
        # for bit.
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,half_rule", [("float16", "half"), ("float16", "float"),
                                             ("float32", "half")])
def test_vectorised_scale_matches_the_elementwise_kernel(dtype, half_rule):
    """Aligned contiguous fp16/fp32 take the 16-byte-load kernel; a view one element off
    16-byte alignment takes the element-wise one: both give the same bits (tails included)."""
    gpu_or_skip()
    import cupy

    from ddpbench import gpu

    host = (np.random.default_rng(2).standard_normal(200_011) * 1e3).astype(dtype)
    for factor in (1 / 3, 1e-4, 7.0):
        big = cupy.asarray(np.concatenate([host[:1], host]))
        aligned, shifted = cupy.asarray(host), big[1:]  # shifted: 2 or 4 bytes off alignment
        assert aligned.data.ptr % 16 == 0 and shifted.data.ptr % 16 != 0
        out_a, out_s = cupy.empty_like(aligned), cupy.empty_like(aligned)
        gpu.scale_copy(aligned, out_a, factor, half_rule)
        gpu.scale_copy(shifted, out_s, factor, half_rule)
        a, b = cupy.asnumpy(out_a), cupy.asnumpy(out_s)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), factor

def test_scale_copy_names_a_bad_half_rule():
    from ddpbench import gpu

    with pytest.raises(ValueError, match="half_rule must be one of half, float"):
        gpu.scale_copy(np.ones(2), np.ones(2), 0.5, "double")


@pytest.mark.gpu
@pytest.mark.mpi
def test_nccl_one_rank():
    gpu_or_skip()
    out = run_mpi(1, SCRIPTS / "check_gpu.py", "nccl", timeout=300)
    assert one(out, "done", transport="nccl", rank=0, size=1)["checks"] > 0
    # the cycle went on past the GPU group waiting on its stream (Horovod's finalizer)
    assert one(out, "deferred", rank=0)["overtaken"] is True


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_host_staging_several_ranks_on_one_gpu(n):
    gpu_or_skip()
    out = run_mpi(n, SCRIPTS / "check_gpu.py", "host", timeout=300)
    assert sorted(r["rank"] for r in results(out, "done", transport="host", size=n)) == list(range(n))


@pytest.mark.gpu
def test_gpu_benchmarks_run_and_check_results():
    gpu_or_skip()
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "allreduce", "--device", "gpu", "-n", "1",
         "--sizes", "4K,4M", "--iters", "3", "--format", "json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert all(r["wrong"] == 0 and r["device"] == "gpu" for r in json.loads(proc.stdout))
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "bench", "scale-kernel", "--sizes", "1M,16M",
         "--iters", "5", "--format", "json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert all(r["wrong_bytes"] == 0 for r in json.loads(proc.stdout))


@pytest.mark.gpu
@pytest.mark.mpi
def test_ranks_sharing_a_gpu_under_nccl_are_refused_with_what_to_do():
    """Two ranks on one GPU with the default NCCL transport: a clear error on every rank
    before the first collective (NCCL would say only 'invalid usage')."""
    gpu_or_skip()
    out = run_mpi(2, SCRIPTS / "gpu_shared.py", timeout=300, env={"CUDA_VISIBLE_DEVICES": "0"})
    got = results(out, "refused")
    assert sorted(r["rank"] for r in got) == [0, 1]
    assert all("gpu_transport='host'" in r["message"] for r in got)
