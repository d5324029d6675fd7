import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def gpu_or_skip():
    """Skip without a usable GPU; fail instead when DDPBENCH_TEST_GPU=1 says one is there."""
    reason = None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            reason = "no CUDA device"
    except Exception as err:  # ImportError, CUDA driver errors
        reason = f"CuPy/GPU unavailable: {err}"
    if reason is not None:
        if os.environ.get("DDPBENCH_TEST_GPU") == "1":
            pytest.fail(f"DDPBENCH_TEST_GPU=1 but {reason}")
        pytest.skip(reason)
