#!/usr/bin/env bash
# The GPU checks of issue 18 in one run on a lent GPU machine (no network there):
#   the GPU test suite, `bench scale-kernel`, `bench allreduce --device gpu` (NCCL, one rank;
#   pinned-host staging at 2 ranks), then the CPU benches at 2, 3 and 4 ranks on a machine
#   with a core per rank; `real_local`: `ddpbench calibrate -n 2` and experiments/real_local.yaml
#   (2 repetitions) against that calibration, where every process has a core, then a second
#   calibration compared with the first.
# Needs what the machine lacks as wheels in .whl/ (simpy, pydantic and its needs, mpi4py and
# the mpich wheel, setuptools): a venv over the system's packages (CuPy, NumPy, torch) gets
# those and ddpbench itself, so `mpiexec` lies beside the interpreter as in a user's venv.
# Each step has its own time limit and a failed step does not stop the rest; logs go to
# $OUT (or ./device_out).
#
# Usage: bash tools/probes/device_check.sh [gpu|cpu|all|real_local]   (default all), on the GPU
#        machine;
#        bash tools/probes/device_check.sh wheels             here, to fill .whl/ (git-ignored)
set -u
cd "$(dirname "$0")/../.."
WHAT=${1:-all}
if [ "$WHAT" = wheels ]; then  # for the GPU machine's Python (3.12, x86-64 Linux)
    mkdir -p .whl
    for p in simpy pydantic pydantic-core annotated-types typing-inspection typing-extensions \
        mpi4py mpich 'setuptools>=77'; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 --platform any -d .whl "$p" || exit 1
    done
    ls .whl
    exit 0
fi
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
export PYTHONUNBUFFERED=1 DDPBENCH_TEST_GPU=1

step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2
    shift 2
    echo "=== $name ($(date +%T), limit ${limit}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "=== $name: rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$LOG"
}

V=/tmp/ddpbench-venv
if [ ! -x "$V/bin/ddpbench" ]; then
    # python3 there may itself be a venv (the one holding torch and CuPy): its packages are
    # reached through a .pth file, after the venv's own, so the carried wheels win
    python3 -m venv "$V" || exit 1
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
        >"$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/system.pth"
    "$V/bin/python" -m pip install -q --no-index --no-deps --no-compile --ignore-installed .whl/*.whl || exit 1
    "$V/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
. "$V/bin/activate"
{
    nvidia-smi -L
    python -c 'import sys, numpy, cupy, mpi4py; from mpi4py import MPI; from cupy.cuda import nccl
print(sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "cuda runtime", cupy.cuda.runtime.runtimeGetVersion(), "nccl", nccl.get_version(),
      "mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])'
    nproc
} 2>&1 | tee -a "$LOG"

if [ "$WHAT" = real_local ]; then
    step 150 "calibrate 2 workers" ddpbench calibrate -n 2 -o "$OUT/machine.yaml"
    sed -e "s#^machine:.*#machine: $OUT/machine.yaml#" -e "s#^repetitions:.*#repetitions: 2#" \
        experiments/real_local.yaml >"$OUT/real_local.yaml"
    # The run's folder stays outside $OUT (its timelines and plots are more files than the
    # device tool brings back); the report, the rows and the plot of real against simulated
    # are copied in.
    step 300 "real_local, 2 repetitions" ddpbench run "$OUT/real_local.yaml" --no-progress \
        --outdir /tmp/real_local
    cp /tmp/real_local/report.md /tmp/real_local/results.csv /tmp/real_local/sim_vs_real.png \
        "$OUT/" 2>&1 | tee -a "$LOG"
    step 150 "calibrate again (repeatability)" ddpbench calibrate -n 2 -o "$OUT/machine2.yaml" \
        --compare "$OUT/machine.yaml"
    echo "=== done $(date +%T)" | tee -a "$LOG"
    exit 0
fi
if [ "$WHAT" != cpu ]; then
    step 200 "gpu tests" python -m pytest -m gpu -v -p no:cacheprovider -o addopts= tests
    step 60 "scale kernel" ddpbench bench scale-kernel --sizes 1M:256M
    step 90 "allreduce gpu nccl 1 rank" ddpbench bench allreduce --device gpu -n 1 \
        --sizes 4K:64M --factor 4
    step 60 "allreduce gpu host staging 2 ranks" ddpbench bench allreduce --device gpu \
        --gpu-transport host -n 2 --sizes 4K,1M,16M,64M
fi
if [ "$WHAT" != gpu ]; then
    H0=horovod:cycle_time=0:idle=wait  # Horovod with HOROVOD_CYCLE_TIME=0, ddpbench's idle rule
    for n in 2 3 4; do
        step 90 "allreduce cpu $n ranks" ddpbench bench allreduce -n "$n" \
            --sizes 4K,1M,16M,64M --peers gloo --backends "mpi,horovod,$H0"
    done
    for n in 2 3 4; do
        step 90 "resnet50 tensors cpu $n ranks" ddpbench bench allreduce -n "$n" \
            --tensors resnet50 --rounds 1 \
            --backends "mpi,horovod,horovod:fusion_threshold=0,$H0,$H0:fusion_threshold=0"
    done
    step 45 "pushpull 1+1" ddpbench bench pushpull --workers 1 --servers 1
    step 45 "pushpull 2+2" ddpbench bench pushpull --workers 2 --servers 2
    # without MPICH's single-copy path (as where ptrace_scope is not 0): README, Reliability
    step 45 "pushpull 1+1 without CMA" env MPIR_CVAR_CH4_CMA_ENABLE=0 \
        ddpbench bench pushpull --workers 1 --servers 1
    step 60 "collective 2 ranks without CMA" env MPIR_CVAR_CH4_CMA_ENABLE=0 \
        ddpbench bench allreduce -n 2 --sizes 1M,16M --backends mpi,collective
fi
echo "=== done $(date +%T)" | tee -a "$LOG"
