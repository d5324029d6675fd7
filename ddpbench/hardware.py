"""Hardware presets of a simulated cluster: devices, transports and intra-host links.

Each constant is set once per device, transport or link, never per experiment point, and
its source is named where it is declared. The tables are plain data (no imports beyond the
standard library), so :mod:`ddpbench.contract` checks names against them and the simulator,
the experiment schema, ``ddpbench simulate`` and a measured machine profile (``ddpbench
calibrate``) all speak of the same things:

- a :class:`Device` is what computes a worker's forward and backward pass: its datasheet
  fp32 peak, dense tensor-core peaks per precision (TF32, fp16, bf16, fp8, fp4) and memory
  bandwidth, and the batch below which it is no longer saturated;
- a :class:`Transport` is how a host's NIC is driven: the fraction of line rate its
  payload reaches, the sender CPU time each message costs, and how much of the
  per-direction rate is left when both directions are busy;
- an :class:`IntraLink` joins the GPUs of one host (PCIe 3/4/5, NVLink 2, or NVLink 3/4/5
  through NVSwitches);
- :func:`nccl_ring`, :func:`nccl_allreduce` and :func:`nccl_collective` are NCCL's own cost
  model of its algorithms (ring, tree, NVLS, NVLSTree, CollNet, PAT: latency per protocol
  and link, the algorithm and protocol its tuner picks), for the collectives of GPUs on a
  real transport; :func:`nccl_link_bytes` what each algorithm sends through each NIC and
  out of each GPU.

Rescaling rule of compute times (:func:`compute_factor`), used by the simulator when a point
names a ``device`` or a ``batch_size`` other than its profile's:

``t' = t x R x (b' + b0_dev) / (b + b0_ref)``

where ``b`` and ``b'`` are the profile's and the point's per-worker batch and ``b0`` a
device's half-saturation batch (:attr:`Device.saturation_batch`). ``R`` is the ratio of the
two devices' measured speeds (:attr:`Device.resnet50`: published fp32 ResNet-50 training
throughputs, one constant per device), where both have one directly or through
:attr:`Device.like` (a device without a published figure scales its nearest measured one by
the peaks); otherwise the peaks alone: ``R = a x F_ref / F_dev + (1 - a) x M_ref / M_dev``
with ``a`` the fraction of the profile's time in matrix products (convolutions, linear
layers, LSTM gates; recorded in the profile), ``F`` the fp32 peak FLOP/s and ``M`` the
memory bandwidth. A profile taken at another precision than fp32 (:attr:`Workload.precision
<ddpbench.simulator.workload.Workload>`) always takes the peak rule, with ``F`` the peaks at
its precision.

Rescaling rule of precision (:func:`precision_factor`), when a point's ``precision`` is not
its profile's, applied on the point's device after the device rule:

``t' / t = a' x F(p) / F(p') + (1 - a') x B(p') / B(p)``

with ``a'`` the matrix-product share on that device (:func:`matmul_fraction_on`), ``F(p)``
its dense peak at precision ``p`` (:meth:`Device.peak_tflops`: fp32 without tensor cores,
TF32, fp16, bf16, fp8 tensor cores) and ``B(p)`` the bytes per activation element
(:data:`ACTIVATION_BYTES`). Gradients then travel at :data:`GRADIENT_BYTES` of the point's
precision. Limits: one measured model (ResNet-50) stands for every profile on a
device; tensor-core products are assumed to reach the same share of their peak as the
profile's own products reach of theirs (they reach less: the checks in
docs/results/2026-12-02-devices-precision.md), the rule knows nothing of memory capacity (a batch that would not fit is not refused), of kernel
launch overheads that dominate tiny layers, or of cuDNN choosing other algorithms at other
batch sizes; away from the profile's device and batch, expect the error to grow (the unit
tests check it against published single-device throughputs within the stated tolerance).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

__all__ = [
    "ACTIVATION_BYTES",
    "DEVICES",
    "FAST_RETRANSMIT_SEGMENTS",
    "GRADIENT_BYTES",
    "INTRA_LINKS",
    "LOSSY_TRANSPORTS",
    "MXNET_REDUCTION_THREADS",
    "MXNET_SERVER_BYTES",
    "MXNET_SERVER_UPDATE_GBPS",
    "NCCL_ALGORITHMS",
    "NCCL_ALGO_SINCE",
    "NCCL_CURRENT_SOURCE",
    "NCCL_FLUSH_LATENCY_SINCE",
    "NCCL_NVLS_EFFICIENCY",
    "NCCL_LL128_SINCE",
    "NCCL_NEWEST",
    "NCCL_PLUGIN_SIMPLE_SINCE",
    "NCCL_PROTOCOLS",
    "NCCL_SOURCE",
    "NCCL_TREE_SINCE",
    "OVERLAP_SLOWDOWN",
    "OVERLAP_SOURCE",
    "PRECISIONS",
    "PROFILED_RESNET50_S",
    "TCP_FLOW_SPREAD",
    "TCP_MSS_BYTES",
    "TCP_RTO_MIN_MS",
    "TRANSPORTS",
    "Device",
    "IntraLink",
    "NcclChoice",
    "NcclFabric",
    "NcclProtocol",
    "Transport",
    "compute_factor",
    "device",
    "gradient_bytes",
    "incast_senders",
    "intra_link",
    "matmul_fraction_on",
    "mxnet_cpu_sum_bytes",
    "nccl_algorithms",
    "nccl_allowed",
    "nccl_allreduce",
    "nccl_collective",
    "nccl_link_bytes",
    "nccl_channels",
    "nccl_hw",
    "nccl_net_latency_us",
    "nccl_per_channel_cap",
    "nccl_protocols",
    "nccl_release",
    "nccl_ring",
    "nccl_tree_latency",
    "overlap_slowdown_of",
    "precision_factor",
    "slowest_share",
    "transport",
]


_T = TypeVar("_T")


PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
"""Arithmetic precisions a :class:`Device` states a peak for (:meth:`Device.peak_tflops`)."""

ACTIVATION_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}
"""Bytes per activation element of the memory-bound part of a training step at a precision
(:func:`precision_factor`). TF32 is a mode of fp32 matrix products only: tensors stay fp32
(NVIDIA's A100 whitepaper). fp16 and bf16 training keep activations in 16 bits. FP8 training
with Transformer Engine runs its linear layers in fp8 and returns their outputs in high
precision; attention and every other operation (normalisation, softmax) run in the
parameters' precision (NVIDIA/TransformerEngine
docs/features/low_precision_training/introduction/introduction.rst at 1498424b, "Mixed
precision with 8- or 4-bit precisions"), so its element-wise bytes are bf16's. (The rule
gives a profile's whole matrix-product share fp8's peak, attention's products included,
which Transformer Engine keeps in bf16 by default.)"""

GRADIENT_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}
"""Bytes per gradient element that data-parallel training at a precision communicates.
fp16 and bf16: the parameters' dtype. PyTorch FSDP reduces gradients in ``reduce_dtype``,
which is ``param_dtype`` unless set (torch/distributed/fsdp/api.py, ``MixedPrecision``;
FSDP2's ``MixedPrecisionPolicy`` in torch/distributed/fsdp/_fully_shard/_fsdp_api.py alike);
DDP's buckets hold gradients in the parameters' dtype; DeepSpeed communicates in
``communication_data_type``, which is fp16 under its fp16 mode and bf16 under its bf16 mode
unless the config sets it (microsoft/DeepSpeed deepspeed/runtime/engine.py,
``communication_data_type``). fp8: Transformer Engine keeps weights in high precision and
returns weight gradients in high precision (the same introduction.rst, "Linear layer data
flow"), so with bf16 parameters they travel as bf16. Exceptions a user may
meet, not modelled: Megatron-LM accumulates and reduces bf16 gradients in fp32
(``--accumulate-allreduce-grads-in-fp32``), and PyTorch AMP (autocast) keeps fp32 parameters
and so fp32 gradients: that is this project's ``mixed`` precision (a profile's measured
speedup, fp16 gradients) or ``fp32`` bytes with reduced-precision compute."""


@dataclass(frozen=True)
class Device:
    """One compute device: datasheet peaks and the batch that half-saturates it.

    Attributes:
        name: the table key (``"V100"``).
        fp32_tflops: peak fp32 TFLOP/s (no tensor cores).
        mem_gbps: memory bandwidth, GB/s.
        saturation_batch: ``b0`` of the batch rule: per-sample time at batch ``b`` is
            ``(b + b0) / b`` times its time at an infinite batch.
        source: where the peaks come from.
        overlap_slowdown: how much longer compute takes while a collective of the GPUs'
            own (a ring allreduce's kernels, a host's intra-host reduction) runs beside
            it: 0.189 = 18.9% longer (see :data:`OVERLAP_SLOWDOWN`); 0 for the CPU entry,
            whose contention a calibrated machine profile measures instead.
        compute_capability: CUDA compute capability (6.1 for a Pascal P4000), None for
            the CPU; a GPU's rings run NCCL (:func:`nccl_ring`), whose model depends on it.
        resnet50: published fp32 training throughputs of ResNet-50 on one such device,
            ``((batch, images/s), ...)``: its measured speed (:func:`compute_factor`); two
            batches also set :attr:`saturation_batch`.
        like: for a device without ``resnet50``, the measured device of the same or the
            nearest architecture that the peak rule scales from; for ``pipedream``, the
            device it stands for (a profile's mixed-precision speedup, measured there,
            applies to it).
        tf32_tflops, fp16_tflops, bf16_tflops, fp8_tflops, fp4_tflops: dense (no 2:4
            sparsity) peak TFLOP/s of matrix products at that precision from the datasheet
            named in :attr:`source` (NVIDIA states the sparse figures, twice these, with an
            asterisk), or None where the device has no such tensor cores
            (:func:`precision_factor` refuses that precision there).
        peaks_source: where those reduced-precision peaks come from (kept apart from
            :attr:`source`, the fp32 figures every shipped report names).
    """

    name: str
    fp32_tflops: float
    mem_gbps: float
    saturation_batch: float
    source: str
    overlap_slowdown: float = 0.0
    compute_capability: float | None = None
    resnet50: tuple[tuple[int, float], ...] = ()
    like: str | None = None
    tf32_tflops: float | None = None
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp4_tflops: float | None = None
    peaks_source: str = ""

    def peak_tflops(self, precision: str) -> float | None:
        """Return the dense peak TFLOP/s of matrix products at ``precision`` (``fp32``,
        ``tf32``, ``fp16``, ``bf16``, ``fp8``, ``fp4``), or None where the device has no
        such arithmetic (tensor cores or, for fp16 on Pascal, packed half arithmetic)."""
        if precision == "fp32":
            return self.fp32_tflops
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; known: {list(PRECISIONS)}")
        value: float | None = getattr(self, f"{precision}_tflops")
        return value

    def speed(self) -> float | None:
        """Return ResNet-50 images/s at an unbounded batch, from :attr:`resnet50` and the
        batch rule (``images/s at b = speed x b / (b + b0)``), or None if not measured."""
        if not self.resnet50:
            return None
        batch, ips = self.resnet50[0]
        return ips * (batch + self.saturation_batch) / batch


def _b0_measured(points: tuple[tuple[int, float], ...]) -> float:
    """Return b0 from two (batch, images/s) of one device: images/s = S b / (b + b0)."""
    (b1, x1), (b2, x2) = points[:2]
    # x1 (b1 + b0) / b1 = x2 (b2 + b0) / b2
    return round((x2 - x1) / (x1 / b1 - x2 / b2), 2)


# b0 for a P100 comes from TensorFlow's published ResNet-50 training throughput on one P100
# (tensorflow.org/performance/benchmarks, DGX-1, synthetic data): 195 images/s at batch 32
# and 219 at batch 64; t(b) ~ (b + b0) fits both with b0 = 9. A faster device needs more
# work in flight to fill it, so b0 scales with fp32 peak (b0 = 9 x F / 10.6 TFLOP/s) where a
# device's own throughputs at two batches do not set it.
_B0_P100, _F_P100 = 9.0, 10.6


def _b0(tflops: float) -> float:
    return round(_B0_P100 * tflops / _F_P100, 2)


OVERLAP_SLOWDOWN = 0.189
"""Compute slowdown of a GPU while communication kernels run beside it.

From Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning (arXiv 2507.03114), abstract: "overlapping computation and communication can
result in an average computational slowdown of 18.9%, with a maximum of 40.0% slowdown",
measured with GPT and LLaMA models on 4 A100s, H100s, MI250s and MI210s. The one stated
average is used for every GPU of the table: no source states it per device, and the
older GPUs (P4000, M60, P100, V100, T4) are assumed to lose no less to NCCL's kernels and
copies, which take SMs and memory bandwidth from compute there as well."""

OVERLAP_SOURCE = ("arXiv 2507.03114 (Characterizing Compute-Communication Overlap in "
                  "GPU-Accelerated Distributed Deep Learning), abstract: an average "
                  "computational slowdown of 18.9% (at most 40%) while communication "
                  "overlaps it, on A100, H100, MI250 and MI210; the average, for every GPU")


# Published fp32 ResNet-50 training throughputs (images/s per GPU, synthetic data):
# TensorFlow's benchmarks page (tensorflow/tensorflow docs_src/performance/benchmarks.md at
# 5984ffef, May 2017: DGX-1 P100, and one K80 of a GCE n1-standard-32-k80x8) and MXNet's
# performance page (apache/mxnet docs/faq/perf.md at 054aeee5, MXNet 1.2: a p3.2xlarge's V100
# SXM2 and a g3.4xlarge's M60).
_RN50_P100 = ((32, 195.0), (64, 219.0))
_RN50_K80 = ((32, 49.5), (64, 51.9))
_RN50_V100 = ((32, 298.51), (64, 343.19))
_RN50_M60 = ((32, 68.34),)
# The shipped profiles' GPU: PipeDream's ResNet-50 profile (msr-fiddle/pipedream) takes
# 0.443419 s per iteration at batch 128 (simulator/profiles/resnet50.yaml), the speed every
# profile's times stand for (the others are built at its effective rates).
PROFILED_RESNET50_S = 0.443419
_RN50_PIPEDREAM = ((128, 128 / PROFILED_RESNET50_S),)

_A100_PEAKS = ("NVIDIA A100 datasheet (SXM): TF32 156, BF16 312 and FP16 312 TFLOP/s of "
               "tensor-core products (312, 624, 624 with sparsity); no fp8")
_HOPPER_PEAKS = ("NVIDIA {} datasheet: TF32 989, BF16 1,979, FP16 1,979 and FP8 3,958 "
                 "TFLOP/s of tensor-core products with sparsity; dense is half of each")

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("pipedream", 15.7, 900.0, _b0_measured(_RN50_V100),
           "the GPU of PipeDream's published profiles, which every shipped workload profile "
           "stands for (its model not recorded; PipeDream ran on V100s, SOSP 2019 section "
           "5.1): the V100's peaks and half-saturation batch, and ResNet-50 at 288.7 images/s "
           "at batch 128, below the V100's published speed",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=7.0,
           resnet50=_RN50_PIPEDREAM, like="V100", fp16_tflops=125.0,
           peaks_source="the V100 SXM2's (NVIDIA Tesla V100 datasheet: 125 TFLOP/s of "
                        "fp16 tensor-core products)"),
    Device("P4000", 5.3, 243.0, _b0(5.3),
           "NVIDIA Quadro P4000 datasheet (5.3 TFLOP/s fp32, 243 GB/s GDDR5): the P3 paper's GPU",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=6.1, like="P100"),
    Device("M60", 4.8, 160.0, _b0(4.8),
           "NVIDIA Tesla M60 datasheet (two GPUs per board: 9.6 TFLOP/s fp32 and 2 x 160 GB/s "
           "GDDR5), one GPU of it: AWS g3.4xlarge's GPU, the P3 paper's scalability runs; "
           "ResNet-50 at 68.34 images/s at batch 32 (MXNet 1.2's performance page)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=5.2, resnet50=_RN50_M60),
    Device("K80", 4.37, 240.0, _b0_measured(_RN50_K80),
           "NVIDIA Tesla K80 datasheet (two GK210 GPUs per board: 8.73 TFLOP/s fp32 at boost and "
           "2 x 240 GB/s GDDR5), one GPU of it: AWS p2 instances' GPU; ResNet-50 at 49.5 and "
           "51.9 images/s at batch 32 and 64 (TensorFlow's benchmarks page, one GCE K80)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=3.7, resnet50=_RN50_K80),
    Device("P100", 10.6, 732.0, _b0_measured(_RN50_P100),
           "NVIDIA Tesla P100 SXM2 datasheet (10.6 TFLOP/s fp32, 732 GB/s HBM2); ResNet-50 at "
           "195 and 219 images/s at batch 32 and 64 (TensorFlow's benchmarks page, DGX-1)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=6.0, resnet50=_RN50_P100,
           fp16_tflops=21.2,
           peaks_source="NVIDIA Tesla P100 datasheet: 21.2 TFLOP/s half precision (packed "
                        "fp16 arithmetic, no tensor cores)"),
    Device("V100", 15.7, 900.0, _b0_measured(_RN50_V100),
           "NVIDIA Tesla V100 SXM2 datasheet (15.7 TFLOP/s fp32, 900 GB/s HBM2); ResNet-50 at "
           "298.51 and 343.19 images/s at batch 32 and 64 (MXNet 1.2's performance page, "
           "p3.2xlarge)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=7.0, resnet50=_RN50_V100,
           fp16_tflops=125.0,
           peaks_source="NVIDIA Tesla V100 datasheet: 125 TFLOP/s of fp16 tensor-core "
                        "products (SXM2); no bf16, tf32 or fp8"),
    Device("V100-PCIe", 14.0, 900.0, _b0(14.0),
           "NVIDIA Tesla V100 PCIe datasheet (14 TFLOP/s fp32, 900 GB/s HBM2): the V100 of "
           "PCIe servers, its clock below the SXM2 board's",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=7.0, like="V100",
           fp16_tflops=112.0,
           peaks_source="NVIDIA Tesla V100 datasheet: 112 TFLOP/s of fp16 tensor-core "
                        "products (PCIe)"),
    Device("T4", 8.1, 320.0, _b0(8.1),
           "NVIDIA T4 datasheet (8.1 TFLOP/s fp32, 320 GB/s GDDR6)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=7.5, like="V100",
           fp16_tflops=65.0,
           peaks_source="NVIDIA T4 datasheet: 65 TFLOP/s mixed precision (fp16 tensor "
                        "cores)"),
    Device("A100", 19.5, 1555.0, _b0(19.5),
           "NVIDIA A100 40GB SXM datasheet (19.5 TFLOP/s fp32 without TF32, 1,555 GB/s)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=8.0, like="V100",
           tf32_tflops=156.0, fp16_tflops=312.0, bf16_tflops=312.0,
           peaks_source=_A100_PEAKS),
    Device("A100-80GB", 19.5, 2039.0, _b0(19.5),
           "NVIDIA A100 80GB SXM datasheet (19.5 TFLOP/s fp32 without TF32, 2,039 GB/s "
           "HBM2e)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=8.0, like="V100",
           tf32_tflops=156.0, fp16_tflops=312.0, bf16_tflops=312.0,
           peaks_source=_A100_PEAKS),
    Device("H100", 67.0, 3350.0, _b0(67.0),
           "NVIDIA H100 SXM datasheet (67 TFLOP/s fp32 without TF32, 3,350 GB/s HBM3)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=9.0, like="V100",
           tf32_tflops=494.5, fp16_tflops=989.5, bf16_tflops=989.5,
           fp8_tflops=1979.0, peaks_source=_HOPPER_PEAKS.format("H100 SXM")),
    Device("H200", 67.0, 4800.0, _b0(67.0),
           "NVIDIA H200 SXM datasheet (67 TFLOP/s fp32, 141 GB HBM3e at 4,800 GB/s): the "
           "H100's compute with more and faster memory",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=9.0, like="V100",
           tf32_tflops=494.5, fp16_tflops=989.5, bf16_tflops=989.5,
           fp8_tflops=1979.0, peaks_source=_HOPPER_PEAKS.format("H200 SXM")),
    Device("B200", 75.0, 7700.0, _b0(75.0),
           "NVIDIA HGX B200, one GPU of it (NVIDIA Blackwell datasheet, individual GPU "
           "specifications of HGX B200: 75 TFLOP/s fp32, 180 GB HBM3e at 7.7 TB/s, "
           "configurable up to 1,000 W)",
           overlap_slowdown=OVERLAP_SLOWDOWN, compute_capability=10.0, like="V100",
           tf32_tflops=1100.0, fp16_tflops=2250.0, bf16_tflops=2250.0, fp8_tflops=4500.0,
           fp4_tflops=9000.0,
           peaks_source="NVIDIA Blackwell datasheet (HGX B200 per GPU, with sparsity): "
                        "TF32 2.2, FP16/BF16 4.5, FP8/FP6 9 and FP4 18 PFLOP/s; dense is "
                        "half of each"),
    Device("cpu", 0.2, 4.1, _b0(0.2),
           "this project's build machine (2 cores of an AMD EPYC): 200 GFLOP/s for a "
           "1024x1024 fp32 np.matmul and 4.1 GB/s for np.copyto of 256 MiB, measured with "
           "NumPy; `ddpbench calibrate` measures a machine of your own"),
)}
"""Device name -> :class:`Device`: the ``device`` axis of a point."""


@dataclass(frozen=True)
class Transport:
    """How a NIC is driven.

    Attributes:
        name: the table key.
        efficiency: payload fraction of line rate a bulk transfer reaches.
        per_message_us: sender CPU time per message (a ring step, a slice, a partition),
            microseconds, on top of its bytes; it occupies the sender like bytes do.
        duplex: fraction of the per-direction rate each direction keeps when both are busy
            (1 = full duplex); every strategy here sends and receives at once.
        control_plane: whether control messages (Horovod's negotiation) cost time.
        source: where the numbers come from.
        socket_gbps: the most one connection carries, Gbit/s of payload, or None for no
            limit: what one receiving ps-lite process takes in (its one ZeroMQ socket; the
            parameter-server backends), and what one ring step moves to the next host (one
            TCP connection per ring; the allreduce backends).
        loopback: whether a worker reaches the parameter server on its own host through
            this transport's stack over the host's loopback, as ps-lite does (no local
            shortcut: ps-lite/src/zmq_van.h ``Connect`` opens ``tcp://`` to every node,
            its own host's included): each such message costs its sender ``per_message``
            and crosses the receiving process's socket, but not the NIC. False: a colocated
            server's parts are free (the ideal network, and ddpbench's own real backends,
            which hand a local part over in memory).
        large_message_bytes: a received message of more than this many bytes lands in a
            fresh memory mapping, or None. ps-lite receives every message into the
            allocation libzmq makes for it (ps-lite/src/zmq_van.h ``RecvMsg``: zmq_msg_recv,
            then the data is kept zero-copy until the server or worker is done with it),
            and glibc's malloc serves a request above its mmap threshold, which rises with
            use to at most 32 MiB on 64-bit (glibc malloc/malloc.c,
            ``DEFAULT_MMAP_THRESHOLD_MAX``), with a new mapping, returned on free.
        page_fault_us: the receiver's extra time per 4 KiB page of such a message: each page
            faults and is zeroed as the bytes land, in the receiving socket's thread (0: not
            charged unless a cluster gives its ``page_fault_us``).
        flow_spread: how unevenly connections that share a NIC split it: the standard
            deviation of one connection's rate over their mean. A transfer striped evenly
            over F such connections moves at F times the slowest (:func:`slowest_share`);
            0 where no source measures it.
        server_cpu: whether parameter servers cost CPU time as the originals' servers spend it
            (MXNet's one server thread: :data:`MXNET_SERVER_BYTES`); False on the analytic
            network, whose servers only sum (the closed forms).
        nccl_net_us: the latency NCCL's network plugin reports for this transport
            (``ncclNetProperties_t.latency``, microseconds), which NCCL's tuner adds to each
            step between hosts (src/graph/tuning.cc: ``interLat += latencyInter``, twice for
            Simple); with it, the transport's per-message cost counts there too
            (:func:`nccl_net_latency_us`). ``None``: a transport from before NCCL's pricing
            took the network's own latency (tcp, rdma, shm, ideal): only a cluster's
            explicit ``per_message_us`` reaches it.
        nccl_simple_below_cc: the network plugin sets ``NCCL_PROTO=simple`` (where the user
            has not set it) on GPUs of a compute capability below this, whose network cannot
            deliver the bytes of a write in order, which NCCL's LL and LL128 protocols need;
            from :data:`NCCL_PLUGIN_SIMPLE_SINCE` on; ``None``: never.
        rto_min_ms: the transport drops packets when a switch port's buffer overflows and
            a flow that cannot fast-retransmit waits this long for its retransmission timer
            (a lossy fabric: TCP over Ethernet); ``None``: the fabric does not drop on
            congestion (InfiniBand's credit-based link-level flow control, RoCE's priority
            flow control, EFA's SRD retransmitting inside the NIC) or the analytic network.
            Used only where a cluster gives its ``switch_buffer_kb``
            (:func:`incast_senders`).
    """

    name: str
    efficiency: float
    per_message_us: float
    duplex: float
    control_plane: bool
    source: str
    socket_gbps: float | None = None
    loopback: bool = False
    large_message_bytes: int | None = None
    page_fault_us: float = 0.0
    flow_spread: float = 0.0
    server_cpu: bool = False
    nccl_net_us: float | None = None
    nccl_simple_below_cc: float | None = None
    rto_min_ms: float | None = None

    def binding_socket_gbps(self, bandwidth_gbps: float,
                            socket_gbps: float | None = None) -> float | None:
        """Return the one-connection ceiling where it is below what a NIC of
        ``bandwidth_gbps`` line rate delivers over this transport (the ceiling binds), else
        None. The ceiling is ``socket_gbps`` when given (a cluster's own figure, the
        ``socket_gbps`` field of :class:`ddpbench.contract.Cluster`), else this transport's."""
        cap = self.socket_gbps if socket_gbps is None else socket_gbps
        if cap is None:
            return None
        return cap if cap < bandwidth_gbps * self.efficiency * self.duplex else None


TCP_FLOW_SPREAD = 0.185
"""Spread of TCP connections sharing a NIC: iperf3 with 2, 4 and 8 parallel connections
between two 100 Gbit/s hosts moved 42.1, 72.2 and 86.6 Gbit/s with the slowest connection at
17.8, 16 and 7.63 (NVIDIA/nccl issue #450), the slowest at 0.85, 0.89 and 0.70 of the mean;
:func:`slowest_share` with this spread gives 0.90, 0.81 and 0.74 (least squares over the
three). NCCL stripes each transfer evenly over its sockets, so it "will be the minimum speed
of the sockets multiplied by the number of sockets" (NVIDIA/nccl-tests issue #83, the
maintainer)."""


TCP_RTO_MIN_MS = 200.0
"""Linux's floor on TCP's retransmission timeout: ``TCP_RTO_MIN`` is ``HZ/5`` jiffies, 200 ms
(include/net/tcp.h), however short the round trip; a flow that loses its window waits it out
(Vasudevan et al., "Safe and Effective Fine-grained TCP Retransmissions for Datacenter
Communication", SIGCOMM 2009, on the default it leaves in data centres)."""

TCP_MSS_BYTES = 1448
"""TCP's payload per Ethernet frame at MTU 1500 with timestamps (1500 - 20 IPv4 - 20 TCP -
12 timestamp option; Linux enables timestamps by default, net.ipv4.tcp_timestamps = 1)."""

FAST_RETRANSMIT_SEGMENTS = 4
"""The window a flow needs to recover a lost segment without its timer: the lost one and
the three behind it whose duplicate ACKs trigger fast retransmit (RFC 5681 section 3.2)."""


def incast_senders(buffer_bytes: float, bandwidth: float, rtt_s: float,
                   mss_bytes: int = TCP_MSS_BYTES) -> int:
    """Return the most TCP senders one switch port takes at once before a drop costs a
    newcomer its retransmission timer (TCP incast).

    The port holds ``buffer_bytes`` and the path ``bandwidth x rtt_s`` bytes (bytes/s, s);
    ``n`` concurrent flows share that, and a flow whose share is under
    :data:`FAST_RETRANSMIT_SEGMENTS` segments has too few packets in flight to draw the three
    duplicate ACKs of fast retransmit when one is dropped: it times out (the account of
    incast in Phanishayee et al., "Measurement and Analysis of TCP Throughput Collapse in
    Cluster-based Storage Systems", FAST 2008, and Zhang et al., "Modeling and Understanding
    TCP Incast in Data Center Networks", INFOCOM 2011). Returns
    ``floor((buffer + bandwidth x rtt) / (4 x mss))``, at least 1."""
    if not buffer_bytes > 0 or not bandwidth > 0 or not rtt_s >= 0:
        raise ValueError(f"buffer ({buffer_bytes} bytes), bandwidth ({bandwidth} bytes/s) "
                         f"must be > 0 and the round trip ({rtt_s} s) >= 0")
    held = buffer_bytes + bandwidth * rtt_s
    return max(1, int(held // (FAST_RETRANSMIT_SEGMENTS * mss_bytes)))


def slowest_share(flows: int, spread: float) -> float:
    """Return the expected slowest of ``flows`` connections over their mean rate:
    ``1 - spread x E[max of flows standard normals]`` (Blom's approximation of the
    expected maximum), at least 0.05; 1 for one connection or no spread."""
    if flows <= 1 or spread <= 0:
        return 1.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf((flows - 0.375) / (flows + 0.25))
    return max(0.05, 1.0 - spread * z)


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (
    Transport("ideal", 1.0, 0.0, 1.0, False,
              "the analytic network of the closed forms: line rate, messages and control "
              "free (the default; results before transports existed)"),
    Transport("tcp", 0.94, 5.0, 1.0, True,
              "efficiency: TCP/IPv4 payload per Ethernet frame at MTU 1500 with timestamps, "
              "1448 of 1538 bytes on the wire; per message: the sender's share of handing a "
              "message to the kernel through ZeroMQ (ps-lite's van) or MPI over TCP, a send "
              "system call and the library's queueing, ~5 us (an estimate of the whole stack; "
              "a small-message round trip costs ~20 us of CPU over both ends; libzmq's own "
              "share, measured with tools/probes/zmq_message_cost.c, libzmq 4.3.5 over loopback "
              "TCP on this project's build machine, is 0.6-0.9 us of sender CPU per "
              "four-frame ps-lite push, a lower bound: ps-lite's protobuf meta and queues "
              "come on top); "
              "socket: a ps-lite process receives on one ZeroMQ socket, which BytePS's authors "
              "measured capped near one kernel TCP connection, ~15 Gbit/s, however many peers "
              "send and whatever ZMQ_IO_THREADS (zeromq/libzmq issue #3525, 100 GbE hosts, "
              "where iperf's single TCP connection also ran at up to 15 Gbit/s); the same "
              "ceiling holds a ring's step to the next host, one connection per ring: NCCL's "
              "socket transport reached 14.5-14.9 Gbit/s of allreduce bus bandwidth on GCP's "
              "32 GbE with 8 GPUs per node, and 2.06 GB/s with one ring (NVIDIA/nccl issue "
              "#209); loopback: ps-lite connects to its own host's server over TCP like any "
              "other (ps-lite/src/zmq_van.h Connect); large messages: above glibc's largest "
              "mmap threshold (32 MiB) each received message lands in a fresh mapping whose "
              "pages fault; not charged by default (page_fault_us 0), since it depends on "
              "the process's allocator: MXNet's build links tcmalloc or jemalloc where it "
              "finds them (make/config.mk: USE_GPERFTOOLS = 1, USE_JEMALLOC = 1), which "
              "keep freed large spans; libzmq's own throughput tools moved 1443 MB/s in 16 MiB "
              "messages and 1049 MB/s in 128 MiB ones (ufo-kit/ufo-filters pull request #147, "
              "2017: 1.07 us per 4 KiB page), and on this project's build machine (a virtual "
              "machine) 64-128 MiB messages over loopback TCP ran at 10-13 Gbit/s against "
              "20-51 at 1-16 MiB (tools/probes/zmq_large_messages.py), a fresh mapping costing "
              "2.6-2.9 us per page more than mapped memory (tools/probes/page_fault_cost.c)",
              socket_gbps=15.0, loopback=True, large_message_bytes=32 << 20, server_cpu=True,
              flow_spread=TCP_FLOW_SPREAD, rto_min_ms=TCP_RTO_MIN_MS),
    Transport("rdma", 0.97, 2.0, 1.0, True,
              "efficiency: RoCEv2 payload at 4096-byte MTU after IB/UDP/IP/Ethernet headers "
              "and ICRC (~3%), as NCCL's maintainers state it for allreduce (peak bus "
              "bandwidth 12 GB/s per 100 Gbit/s NIC, 0.96: NVIDIA/nccl-tests issue #119); "
              "per message: a verbs post and completion, ~2 us (ib_send_lat-class "
              "small-message cost)", server_cpu=True),
    Transport("ib", 0.96, 1.0, 1.0, True,
              "InfiniBand with GPUDirect RDMA (NCCL's IB transport, src/transport/net_ib): "
              "efficiency: 'We usually consider 24GB/s is the peak performance per 200G NIC "
              "(12 GB/s for 100G NICs)' (NVIDIA/nccl-tests issue #119, the NCCL maintainer), "
              "0.96 of line rate; per message: a verbs post and its completion, ~1 us "
              "(ib_send_lat over an RC queue pair: 0.83 us one way at 32 bytes, 1.58 us at "
              "1 KiB; D. Potter's master's thesis, git.dennispotter.eu masters-thesis "
              "tables/mtu_performance.tex); NCCL "
              "latency: the IB plugin reports none ('props->latency = 0; // Not set', "
              "src/transport/net_ib/init.cc), so NCCL prices a step between hosts at "
              "tuning.cc's NET hardware latency plus the per-message cost", server_cpu=True,
              nccl_net_us=0.0),
    Transport("roce", 0.96, 2.0, 1.0, True,
              "RoCE v2 with GPUDirect RDMA through NCCL's same IB transport: efficiency as "
              "ib (NVIDIA/nccl-tests issue #119 quotes it for either), per message as the "
              "rdma preset (~2 us, a verbs post and completion over RoCE); NCCL latency: "
              "the IB plugin reports none (src/transport/net_ib/init.cc)", server_cpu=True,
              nccl_net_us=0.0),
    Transport("efa", 0.84, 3.0, 1.0, True,
              "AWS Elastic Fabric Adapter through aws-ofi-nccl (libfabric's efa provider, "
              "SRD): NCCL latency: the plugin reports 75 us to NCCL's tuner on p4d, p4de and "
              "p5 instances (aws/aws-ofi-nccl src/platform-aws.cpp, platform_data_map "
              "'.latency = 75.0'), which tuning.cc adds to every step between hosts; per "
              "message: '~2usec cost in the device and ~1usec cost to write that completion "
              "up to the host stack' (aws-ofi-nccl include/nccl_ofi_param.h), 3 us; "
              "efficiency: 78.33 GB/s of allreduce bus bandwidth at 2 GiB on 2 p4de.24xlarge "
              "(aws-samples/awsome-distributed-training nccl-tests README, a fit point), 0.84 "
              "of the 93.75 GB/s a double binary tree over their 4 x 100 Gbit/s allows; "
              "protocols: Simple only on the A100 and V100 instances (p4d, p4de, p3dn), "
              "where the plugin finds no in-order delivery of 128-byte-aligned writes and "
              "sets NCCL_PROTO=simple (aws-ofi-nccl src/platform-aws.cpp, 'force the simple "
              "protocol as the LL/LL128 protocols can lead to data corruption without data "
              "delivery ordering'; a p4d.24xlarge log in aws/aws-ofi-nccl issue #715: "
              "'Setting NCCL_PROTO to \"simple\"'); p5 and later (compute capability 9.0+) "
              "keep NCCL's default (aws/aws-ofi-nccl pull requests #280 and #516)",
              server_cpu=True, nccl_net_us=75.0, nccl_simple_below_cc=9.0),
    Transport("shm", 1.0, 1.0, 1.0, True,
              "processes on one host through shared memory: bandwidth_gbps is the copy "
              "bandwidth; ~1 us per message to signal the peer", server_cpu=True),
)}
"""Transport name -> :class:`Transport`: the ``transport`` axis of a point."""

LOSSY_TRANSPORTS: tuple[str, ...] = tuple(sorted(n for n, t in TRANSPORTS.items()
                                                 if t.rto_min_ms is not None))
"""The transports that drop on congestion (a minimum retransmission timeout), the ones a
cluster's ``switch_buffer_kb`` applies to."""


def nccl_net_latency_us(tr: Transport, per_message_us: float | None = None) -> float:
    """Return what NCCL's tuner adds to a step between hosts for the network itself, us.

    As tuning.cc does with ``graphs[a]->latencyInter`` (``NCCL_SOURCE``): the plugin's
    reported latency (:attr:`Transport.nccl_net_us`) plus the per-message cost of posting
    the step's message (``per_message_us`` when given, else the transport's own), on top of
    its table's NET hardware latency. A transport without ``nccl_net_us`` adds only an
    explicit ``per_message_us`` (0 when None), so its results are those from before.
    The cluster's ``latency_us`` is not added: the NET row of NCCL's table stands for the
    fabric's own latency.
    """
    if tr.nccl_net_us is None:
        return per_message_us or 0.0
    cost = tr.per_message_us if per_message_us is None else per_message_us
    return tr.nccl_net_us + cost


MXNET_SERVER_BYTES: dict[str, int] = {"copy": 2, "add": 3, "update": 5, "pull": 2}
"""Bytes of memory traffic per byte of a key that MXNet's parameter server moves for each of
its steps (apache/mxnet src/kvstore/kvstore_dist_server.h, 0.11.0 to 1.9.1, ``DataHandleDefault``
and ``DefaultStorageResponse``): a round's first push is copied into the merge buffer (read,
write), every later push is added to it (read two, write one), the last push runs the
optimizer on the key (SGD with momentum: read weight, gradient and momentum, write weight
and momentum) and every pull is answered from a copy of the stored value (a copy its source
comment asks to remove one day). One ps-lite customer thread does all of it for a server process, one
request after another, and waits for each push's engine operation before taking the next
(the same file: ``WaitToRead`` after each merge), so a server's pushes and pulls of every key
form one queue. P3's servers run the same code (its MXNet fork)."""

MXNET_REDUCTION_THREADS = 4
"""Threads with which MXNet's CommCPU sums an array of at least ``MXNET_KVSTORE_BIGARRAY_BOUND``
(10^6) elements (src/kvstore/comm.h: ``MXNET_KVSTORE_REDUCTION_NTHREADS``, default 4; a smaller
array is summed by one thread)."""


def mxnet_cpu_sum_bytes(gpus: int) -> int:
    """Return the bytes of memory traffic per byte of an array that MXNet's CommCPU moves to sum
    ``gpus`` copies of it in host memory (src/kvstore/comm.h, ``ReduceSumCPU``): every copy but
    the first is read once, and the first is read and written once per pass of up to four
    others (``in_0 += in_1 + in_2 + in_3 + in_4``)."""
    if gpus <= 1:
        return 0
    return (gpus - 1) + 2 * -(-(gpus - 1) // 4)


MXNET_SERVER_UPDATE_GBPS = 21.5
"""Gbit/s of parameters an MXNet server's optimizer updates: apache/mxnet issue #14485 (a
BytePS author, 2019, MXNet 1.4, dist_sync, AlexNet): updating one 2 MB key on the server took
about 780 us with one worker. With :data:`MXNET_SERVER_BYTES` it sets the server thread's
memory traffic, 5 x 21.5 Gbit/s, which every other step of the thread moves too."""


@dataclass(frozen=True)
class IntraLink:
    """The link between the GPUs of one host.

    Attributes:
        name: the table key.
        bandwidth_gbps: per GPU per direction, Gbit/s, as a ring over the host's GPUs
            achieves it (bus bandwidth) where it stays under one switch; also each GPU's own
            path to the host's memory.
        latency_us: per ring step.
        source: where the numbers come from.
        switch_gpus: GPUs under one PCIe switch, or None (no switches in the way): a ring
            over more GPUs than that crosses from one switch to the other through the CPU.
        cross_gbps: what such a ring's step achieves then, Gbit/s per direction.
        host_gbps: a PCIe switch's uplink to the CPU, Gbit/s per direction: what copies
            between the GPUs under it and the host's memory share.
        host_share: GPUs whose copies to and from the host's memory share one such uplink.
        hw: the row of NCCL's hardware latencies its steps take (``"nvlink"`` or
            ``"pcie"``); ``None`` = the name (the two original presets).
        nvswitch: the GPUs meet in NVSwitches (every GPU one hop from every other), which
            NCCL's NVLS algorithms and CollNet Direct need (src/graph/search.cc: no NVLS
            graph without an NVS node; tuning.cc: CollNet Direct off where ``nvsCount`` is 0).
        nvlink_gbytes: one GPU's NVLink bandwidth per direction as NCCL's topology counts it
            (links x ``SMxx_NVLINK_BW``, src/graph/topo.h), GB/s: the budget its NVLS graph's
            channels split (0 without NVLink).
        nvls_gbps: the bus bandwidth an NVLS allreduce over the host's GPUs reaches
            (NVLink SHARP in the NVSwitches), Gbit/s; ``None`` = no NVLS (before compute
            capability 9.0, or no NVSwitch).
    """

    name: str
    bandwidth_gbps: float
    latency_us: float
    source: str
    switch_gpus: int | None = None
    cross_gbps: float | None = None
    host_gbps: float = 96.0
    host_share: int = 1
    hw: str | None = None
    nvswitch: bool = False
    nvlink_gbytes: float = 0.0
    nvls_gbps: float | None = None

    @property
    def nccl_hw(self) -> str:
        """Return the row of NCCL's ``hwLat`` table this link's steps are priced at:
        ``"nvlink"`` or ``"pcie"`` (``NCCL_HW_NVLINK``, ``NCCL_HW_PCI``)."""
        return self.hw or self.name

    def ring_gbps(self, gpus: int) -> float:
        """Return the bus bandwidth a ring over ``gpus`` GPUs of one host reaches, Gbit/s:
        the link's, or the cross-switch figure once the ring leaves one switch."""
        if self.switch_gpus is not None and self.cross_gbps is not None \
                and gpus > self.switch_gpus:
            return min(self.bandwidth_gbps, self.cross_gbps)
        return self.bandwidth_gbps


INTRA_LINKS: dict[str, IntraLink] = {x.name: x for x in (
    IntraLink("pcie", 96.0, 5.0,
              "PCIe 3.0 x16: 15.75 GB/s raw per direction, ~12 GB/s achieved by NCCL "
              "all-reduce bus bandwidth under one PCIe switch (NCCL's own figure for a PCIe "
              "Gen3 x16 path, src/graph/topo.h PCI_WIDTH 12, v2.5.6); an 8-GPU PCIe server "
              "puts 4 GPUs under each of two switches (BytePS docs/performance.md: '4 GPUs "
              "under one PCIe switch, and each machine contains two PCIe switches'), and a "
              "ring that crosses from one switch to the other through the CPU reached 8.23 "
              "GB/s of allreduce bus bandwidth against 11.28 under one switch (NVIDIA/nccl "
              "issue #44, a pair of switches on one CPU); copies to and from the host's "
              "memory: the 4 GPUs of a switch share its x16 uplink to the CPU, at the same "
              "~12 GB/s",
              switch_gpus=4, cross_gbps=65.8, host_gbps=96.0, host_share=4),
    IntraLink("nvlink", 1040.0, 3.0,
              "NVLink 2 on a DGX-1V / p3.16xlarge: ~130 GB/s NCCL all-reduce bus bandwidth "
              "over 8 V100s (nccl-tests); copies to and from the host's memory go over PCIe "
              "3.0 x16, two GPUs (and an InfiniBand NIC) under each of four PCIe switches "
              "(NVIDIA DGX-1 System Architecture white paper, WP-08437-001, sections 2 and "
              "3.3), ~12 GB/s per switch as NCCL counts a Gen3 x16 path",
              host_gbps=96.0, host_share=2),
    IntraLink("pcie4", 192.0, 5.0,
              "PCIe 4.0 x16 (16 GT/s): 31.5 GB/s raw per direction, 24 GB/s as NCCL counts "
              "the path (src/graph/topo.cc: width x 120 / 80 GB/s for 16 GT/s lanes, twice "
              "Gen3's PCI_BW 12), the figure a ring's bus bandwidth reaches as for the pcie "
              "preset; the GPUs' switches are not modelled (a ring stays at the link's "
              "rate); latency per step as the pcie preset; each GPU's copies to the host's "
              "memory over its own x16 path",
              hw="pcie", host_gbps=192.0, host_share=1),
    IntraLink("pcie5", 384.0, 5.0,
              "PCIe 5.0 x16 (32 GT/s): 63 GB/s raw per direction, 48 GB/s as NCCL counts "
              "the path (src/graph/topo.cc: width x 240 / 80 for 32 GT/s lanes); otherwise "
              "as pcie4",
              hw="pcie", host_gbps=384.0, host_share=1),
    IntraLink("nvlink2-nvswitch", 1040.0, 3.0,
              "NVLink 2 through first-generation NVSwitch (DGX-2 / DGX-2H: 16 V100 SXM3 on "
              "two baseboards of six NVSwitches each, six NVLinks per GPU, 300 GB/s "
              "bidirectional, 150 GB/s per direction; NVIDIA DGX-2 System Architecture white "
              "paper): no nccl-tests figure of the board was found, so the "
              "ring's bus bandwidth keeps the nvlink preset's measured 130 GB/s of the same "
              "six NVLink 2 links per V100; NCCL counts 6 x 20 GB/s (SM70_NVLINK_BW, "
              "src/graph/topo.h); no NVLS (compute capability 7.0); each pair of GPUs and "
              "its InfiniBand NIC under one PCIe 3.0 switch (the same white paper), ~12 GB/s "
              "as NCCL counts a Gen3 x16 path",
              hw="nvlink", host_gbps=96.0, host_share=2, nvswitch=True,
              nvlink_gbytes=6 * 20.0),
    IntraLink("nvlink3-nvswitch", 1846.0, 3.0,
              "NVLink 3 through NVSwitch (DGX/HGX A100: 12 NVLinks per GPU, 600 GB/s "
              "bidirectional, 300 GB/s per direction; NVIDIA A100 datasheet): 230.77 GB/s "
              "NCCL all-reduce bus bandwidth at 1 GiB on one p4d.24xlarge's 8 A100s "
              "(nccl-tests, NVIDIA/nccl issue #527); NCCL counts 12 x 20 GB/s "
              "(SM80_NVLINK_BW, src/graph/topo.h); no NVLS (compute capability 8.0); each "
              "pair of GPUs and its NICs under one PCIe 4.0 switch to the CPU (NVIDIA DGX "
              "A100 System Architecture white paper), 24 GB/s as NCCL counts a Gen4 x16 path",
              hw="nvlink", host_gbps=192.0, host_share=2, nvswitch=True,
              nvlink_gbytes=240.0),
    IntraLink("nvlink4-nvswitch", 2960.0, 3.0,
              "NVLink 4 through NVSwitch (HGX H100/H200: 18 NVLinks per GPU, 900 GB/s "
              "bidirectional, 450 GB/s per direction; NVIDIA H100 datasheet): ring bus "
              "bandwidth 370 GB/s and NVLS ~480 GB/s on 8 H100s (NVIDIA/nccl-tests issue "
              "#212, the NCCL maintainer: 'an effective NVLink bandwidth of 370GB/s' with "
              "NCCL_ALGO=RING, 'a peak busBw of ~480GB/s' with NVLink SHARP); NCCL counts "
              "18 x 20.6 GB/s (SM90_NVLINK_BW); each GPU and its NIC under a PCIe 5.0 "
              "switch of their own (NVIDIA DGX H100 User Guide: eight ConnectX-7, one per "
              "GPU), 48 GB/s as NCCL counts a Gen5 x16 path",
              hw="nvlink", host_gbps=384.0, host_share=1, nvswitch=True,
              nvlink_gbytes=18 * 20.6, nvls_gbps=3840.0),
    IntraLink("nvlink5-nvswitch", 5920.0, 3.0,
              "NVLink 5 through NVSwitch (HGX B200: 18 NVLinks per GPU, 1.8 TB/s "
              "bidirectional, 900 GB/s per direction; NVIDIA B200 datasheet); no published "
              "nccl-tests figure was found: the ring's and NVLS's bus bandwidth keep the "
              "H100's measured fractions of line rate (370/450 and 480/450, NVIDIA/nccl-tests "
              "issue #212), 740 and 960 GB/s; NCCL counts 18 x 40.1 GB/s (SM100_NVLINK_BW); "
              "each GPU and its NIC under a PCIe 5.0 switch as on the H100 boards",
              hw="nvlink", host_gbps=384.0, host_share=1, nvswitch=True,
              nvlink_gbytes=18 * 40.1, nvls_gbps=7680.0),
)}
"""Intra-host link name -> :class:`IntraLink`: the ``intra_link`` axis of a point."""


def nccl_hw(intra_link: str) -> str:
    """Return the row of NCCL's hardware latencies a link's steps take (``"nvlink"`` or
    ``"pcie"``): :attr:`IntraLink.nccl_hw` of a preset, else the name itself."""
    link = INTRA_LINKS.get(intra_link)
    return link.nccl_hw if link is not None else intra_link


NCCL_SOURCE = ("NVIDIA/nccl src/graph/tuning.cc (the repository's stored version, commit b647562, "
               "copyright 2016-2022): ncclTopoTuneModel's ring latencies and "
               "ncclTopoGetAlgoTime's 'plateau effect of ring'")


@dataclass(frozen=True)
class NcclProtocol:
    """One of NCCL's protocols as its tuning model prices a ring (``NCCL_SOURCE``).

    Attributes:
        name: ``"LL"``, ``"LL128"`` or ``"Simple"``.
        base_us: the fixed latency of one collective (``baseLat``, ring).
        step_us: the latency of one ring step by the link it crosses: ``nvlink`` or
            ``pcie`` inside a host, ``net`` between hosts (``hwLat``, ring).
        tree_base_us: the tree's fixed latency (``baseLat``, tree).
        tree_step_us: the latency of one tree hop by the link it crosses (``hwLat``, tree).
        tree_share: the tree's bandwidth under this protocol as a fraction of Simple's
            (1/3.8 for LL, 120/128 for LL128 across hosts; 7/9 on one host).
        tree_correction: ``treeCorrectionFactor``: the tree's bandwidth at 64 B x 2**k,
            k = 0..22 (medium sizes reach less of it than the model's plateau).
    """

    name: str
    base_us: float
    step_us: dict[str, float]
    tree_base_us: float = 0.0
    tree_step_us: dict[str, float] | None = None
    tree_share: float = 1.0
    tree_correction: tuple[float, ...] = ()


NCCL_PROTOCOLS: tuple[NcclProtocol, ...] = (
    NcclProtocol("LL", 6.6, {"nvlink": 0.6, "pcie": 1.0, "net": 2.7},
                 6.8, {"nvlink": 0.6, "pcie": 1.0, "net": 5.0}, 1 / 3.8,
                 (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8,
                  .9, 1.0, 1.0, 1.0, 1.0)),
    NcclProtocol("LL128", 14.0, {"nvlink": 1.9, "pcie": 2.5, "net": 4.0},
                 14.0, {"nvlink": 1.25, "pcie": 1.9, "net": 8.5}, 120 / 128,
                 (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
                  .9, .9, .9, 1.0, 1.0)),
    NcclProtocol("Simple", 8.4, {"nvlink": 3.4, "pcie": 5.7, "net": 14.0},
                 0.0, {"nvlink": 28.0, "pcie": 28.0, "net": 28.0}, 1.0,
                 (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
                  .7, .8, .9, .9)),
)
"""NCCL's ring protocols in the order its tuner tries them (the first of equal times wins)."""

NCCL_NEWEST = (2, 20, 3)
"""The NCCL release whose rules apply when a point names none (:data:`NCCL_SOURCE`)."""

NCCL_PLUGIN_SIMPLE_SINCE = (2, 18, 1)
"""The first NCCL release after aws-ofi-nccl v1.6.0 (2023-04-21), the plugin release that
began setting ``NCCL_PROTO=simple`` itself (src/platform-aws.c, ``force_proto_simple``);
before it the plugin's documentation told users to set it (doc/efa-env-var.md: "Use for
aws-ofi-nccl<=1.5.0"), which a point does with ``nccl_proto``. A point's NCCL release
stands for its plugin's era (:attr:`Transport.nccl_simple_below_cc`)."""

NCCL_LL128_SINCE = (2, 5, 6)
"""LL128 first shipped in NCCL v2.5.6-1 (NVIDIA/nccl commit 299c554d, 2019-11-19)."""


def nccl_release(value: str | None) -> tuple[int, int, int]:
    """Return an ``nccl_version`` such as ``"2.3.7"`` as a tuple (None: :data:`NCCL_NEWEST`).

    Raises:
        ValueError: not of the form major.minor.patch with major 2, naming ``nccl_version``.
    """
    if value is None:
        return NCCL_NEWEST
    parts = str(value).strip().split(".")
    try:
        release = tuple(int(x) for x in parts)
    except ValueError:
        release = ()
    if len(release) != 3 or release[0] != 2 or min(release) < 0:
        raise ValueError(f"nccl_version: expected a release such as '2.3.7' (NCCL 2.x), "
                         f"got {value!r}")
    return (release[0], release[1], release[2])


def nccl_channels(release: tuple[int, int, int], intra_link: str, gpus_per_host: int = 2) -> int:
    """Return the rings (channels) NCCL opens through each of a host's NICs by default.

    As each release's topology code decides it (NVIDIA/nccl, read at the release tags):
    2.3.x gives each inter-host ring a NIC of its own, so one NIC carries one ring
    (src/transport/net.cu ``netGetRings``); 2.4.x duplicates the rings of NVLink hosts that
    span several nodes (src/misc/rings.cc, "Duplicate the rings in case of
    multinode+NVLink"); from 2.5 the search finds one channel at the NIC's speed and
    src/graph/connect.cc doubles every channel. Each channel opens its own connection.
    One GPU per host has no NVLink to duplicate over. On rail-optimised hosts of several
    NICs the search finds channels through every NIC alike (each GPU's nearest), so the
    count holds per NIC and a host has ``nics_per_host`` times as many.
    """
    if release < (2, 4, 0):
        return 1
    if release < (2, 5, 0):
        return 2 if nccl_hw(intra_link) == "nvlink" and gpus_per_host > 1 else 1
    return 2


def _parse_nccl_list(value: str, names: list[str], field: str, variable: str) -> dict[str, int]:
    """Return each name's state (1 on, 0 off) under a list setting read as NCCL's
    ``parseList`` reads it: names separated by commas turn on those named and no other,
    ``^`` and names turn off those named and on every other; case-insensitive. Unlike NCCL,
    an unknown name or a setting that leaves none on is an error naming ``field``."""
    text = value.strip()
    exclude = text.startswith("^")
    items = [t.strip() for t in text.removeprefix("^").split(",") if t.strip()]
    known = {n.lower(): n for n in names}
    unknown = [t for t in items if t.lower() not in known]
    if unknown or not items:
        raise ValueError(f"{field}: expected {variable}'s syntax, names of {names} "
                         f"separated by commas, or ^ and the ones to leave out; got {value!r}")
    listed = {known[t.lower()] for t in items}
    states = {n: int((n in listed) != exclude) for n in names}
    if not any(states.values()):
        raise ValueError(f"{field}: {value!r} leaves none of {names} on")
    return states


def nccl_protocols(value: str | None) -> dict[str, int]:
    """Return each protocol's state under an ``NCCL_PROTO`` setting: 1 on, 0 off, 2 NCCL's
    own choice (LL128 by default: on only where NCCL enables it, see :func:`nccl_ring`).

    As NCCL reads the variable (``parseList`` in ``NCCL_SOURCE``): ``None`` is NCCL's
    default; ``"LL,Simple"`` turns on the protocols named and no other; ``"^LL128"`` turns
    off those named and on every other (LL128 then on whatever the GPU). Names are
    case-insensitive. Unlike NCCL, an unknown name or a setting that leaves no protocol is
    an error naming ``nccl_proto``.
    """
    names = [p.name for p in NCCL_PROTOCOLS]
    if value is None:
        return {n: 2 if n == "LL128" else 1 for n in names}
    return _parse_nccl_list(value, names, "nccl_proto", "NCCL_PROTO")


NCCL_ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
"""NCCL's algorithms in its tuner's order (``ncclAlgoStr``, src/include/device.h; the first of
equal times wins: src/enqueue.cc ``topoGetAlgoInfo`` keeps the least time strictly)."""

NCCL_TREE_SINCE = (2, 4, 0)
"""NCCL's double binary trees first shipped in NCCL 2.4.2-1 (NVIDIA/nccl src/init.cu,
``ncclTreeThreshold``); earlier releases run rings only."""

NCCL_ALGO_SINCE: dict[str, tuple[int, int, int]] = {
    "Tree": NCCL_TREE_SINCE, "Ring": (2, 0, 0), "CollNetDirect": (2, 6, 4),
    "CollNetChain": (2, 14, 3), "NVLS": (2, 17, 1), "NVLSTree": (2, 18, 1), "PAT": (2, 23, 4)}
"""The release each algorithm first shipped in (NVIDIA/nccl's history of src/graph/tuning.cc:
CollNet in 2.6.4-1, named ``CollNet`` until CollNetChain joined it in 2.14.3-1; NVLS in
2.17.1-1; NVLSTree in 2.18.1-1; PAT in 2.23.4-1, for allgather and reduce-scatter only)."""


def nccl_algorithms(value: str | None,
                    release: tuple[int, int, int] = NCCL_NEWEST) -> dict[str, int]:
    """Return each algorithm's state under an ``NCCL_ALGO`` setting (1 on, 0 off).

    As NCCL reads the variable (``parseList``, ``NCCL_SOURCE``): ``None`` is NCCL's default
    (every algorithm the release has on), ``"Ring,Tree"`` turns on those named alone,
    ``"^NVLS"`` turns those named off. Names are case-insensitive, of
    :data:`NCCL_ALGORITHMS` (``"CollNet"`` for CollNetDirect before 2.14, as those releases
    spelled it); NCCL's per-collective prefixes (``"allreduce:..."``) are not read. An
    algorithm the release does not have (:data:`NCCL_ALGO_SINCE`) is off. Which of those on
    a topology allows is :func:`nccl_allreduce`'s. NCCL 2.4 had no ``NCCL_ALGO``; there
    ``"Ring"`` stands for ``NCCL_TREE_THRESHOLD=0`` and ``"Tree"`` for a threshold above
    every size.

    Raises:
        ValueError: an unknown name, a setting that leaves no algorithm on, or one that
            leaves on only algorithms the release does not have, naming ``nccl_algo``.
    """
    names = list(NCCL_ALGORITHMS)
    if value is None:
        states = dict.fromkeys(names, 1)
    else:
        text = value.strip()
        if release < NCCL_ALGO_SINCE["CollNetChain"]:
            sign = "^" if text.startswith("^") else ""
            text = sign + ",".join("CollNetDirect" if t.strip().lower() == "collnet" else t
                                   for t in text.removeprefix("^").split(","))
        states = _parse_nccl_list(text, names, "nccl_algo", "NCCL_ALGO")
    for name in names:
        if release < NCCL_ALGO_SINCE[name]:
            states[name] = 0
    if not any(states.values()):
        have = [n for n in names if release >= NCCL_ALGO_SINCE[n]]
        raise ValueError(f"nccl_algo: {value!r} leaves on none of the algorithms NCCL "
                         f"{'.'.join(map(str, release))} has ({have})")
    return states


def _log2i(n: int) -> int:
    """Return floor(log2 n) for n >= 1 and 0 for n < 1, as NCCL's ``log2i``."""
    return max(int(n), 1).bit_length() - 1


def _nccl24_tree_threshold(ranks: int, nodes: int, intra_link: str, channels: int) -> float:
    """Return the largest allreduce (bytes) NCCL 2.4 runs on its trees.

    NCCL 2.4's rule (src/init.cc ``ncclTreeThreshold`` at v2.4.8-1): a ring of ``5000 x
    channels`` B/us on NVLink hosts (5000 otherwise) against trees at 3/4 of it (twice that
    on two NVLink hosts; 2/3 without NVLink), ring latency 6 us x (ranks - 1), tree latency
    15 us x log2(nodes) + 4 us x (ranks/nodes - 1); the trees win below the size where the
    two lines cross, at every size when they are the faster, never on one host.
    """
    nvlink = nccl_hw(intra_link) == "nvlink"
    ringbw = 5000.0 * channels if nvlink else 5000.0
    treebw = ringbw * 3 / 4 if nvlink else ringbw * 2 / 3
    if nvlink and nodes == 2:
        treebw *= 2
    ringlat = 6.0 * (ranks - 1)
    treelat = 15.0 * _log2i(nodes) + 4.0 * (ranks // nodes - 1)
    if nodes < 2 or ringlat <= treelat:
        return 0.0
    if treebw > ringbw:
        return math.inf
    return ringbw * treebw / (ringbw - treebw) * (ringlat - treelat)


class NcclChoice(NamedTuple):
    """The algorithm and protocol NCCL's tuner picks for one collective.

    Attributes:
        algorithm: one of :data:`NCCL_ALGORITHMS`.
        protocol: ``"LL"``, ``"LL128"`` or ``"Simple"``.
        latency_s: the algorithm's fixed latency under that protocol, seconds.
        share: the fraction of the algorithm's own bytes rate it reaches (its bytes' time
            is divided by it); 1 for the NVLS and CollNet algorithms, whose bytes the
            strategies time at the links' own rates.
        time_s: the tuner's predicted time of the collective, seconds.
    """

    algorithm: str
    protocol: str
    latency_s: float
    share: float
    time_s: float = 0.0


@dataclass(frozen=True)
class NcclFabric:
    """What NCCL's tuner knows of a cluster's network beyond its ring.

    Attributes:
        net_us: the network's own latency per step between hosts
            (:func:`nccl_net_latency_us`), microseconds.
        nics: NICs per host (rail-optimised: GPU i to NIC i mod nics).
        nic_gbytes: one NIC's line rate, GB/s, as NCCL counts it (``speed / 8000``,
            src/graph/topo.cc).
        collnet: the fabric reduces in the network (SHARP, ``NCCL_COLLNET_ENABLE=1``).
        intra_gbytes: the bus bandwidth of a ring inside a host, GB/s, where the tree's
            graph on two hosts may run faster than the network (search.cc raises a tree
            graph's ``bwIntra`` up to twice its ``bwInter``, "increase bwIntra for trees
            (2 nodes or collnet)", since 2.6.4; tuning.cc prices every algorithm on at most
            two nodes at ``bwIntra``); 0 = not applied (the transports from before the
            network's latency reached NCCL's pricing keep their results).
    """

    net_us: float = 0.0
    nics: int = 1
    nic_gbytes: float = 0.0
    collnet: bool = False
    intra_gbytes: float = 0.0


NCCL_NVLS_EFFICIENCY = {9: 0.85, 10: 0.74}
"""``nvlsEfficiency`` of NVIDIA/nccl src/graph/tuning.cc (v2.30, ``NCCL_CURRENT_SOURCE``):
the fraction of an NVLS channel's NVLink bandwidth its bus bandwidth reaches, Hopper (9.x)
and Blackwell (10.x); Volta and Ampere have no NVLS."""

NCCL_CURRENT_SOURCE = ("NVIDIA/nccl src/graph/tuning.cc, src/graph/search.cc and "
                       "src/graph/topo.h at commit 5067397c (v2.30.7-1, 2026): the NVLS, "
                       "NVLSTree, CollNetDirect, CollNetChain and PAT models, the network's "
                       "latencyInter")

# tuning.cc's hardware latencies (us, Simple) of the algorithms beyond ring and tree, by
# link row: NVLink/PCI inside a host, NET between hosts (NCCL_CURRENT_SOURCE).
_NCCL_SIMPLE_LAT = {
    "CollNetDirect": {"nvlink": 3.7, "pcie": 3.7, "net": 31.0},
    "CollNetChain": {"nvlink": 2.8, "pcie": 2.8, "net": 30.0},
    "NVLS": {"nvlink": 25.0, "pcie": 0.0, "net": 18.0},
    "NVLSTree": {"nvlink": 25.0, "pcie": 0.0, "net": 20.9},
    "PAT": {"nvlink": 4.0, "pcie": 4.0, "net": 14.0},
}
_NCCL_TREE_NET_SIMPLE_US = 14.0  # the tree's NET latency, which one GPU per host exposes
_NCCL_PAT_BASE_US = 8.0
# perChMaxNVLSTreeBws (GB/s per channel) by one, two, more hosts; Hopper, Blackwell.
_NVLS_TREE_PER_CH = {9: (0.0, 57.7, 45.5), 10: (0.0, 96.0, 80.0)}
# search.cc's channel speeds (GB/s) the NVLS graph tries, fastest first.
_SM90_SPEEDS = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
_SM100_SPEEDS = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
_NCCL_MAX_NVLS_ARITY = 32
_NCCL_MAX_DIRECT_ARITY = 7


def _cc_major(compute_capability: float) -> int:
    return 10 if compute_capability >= 10.0 else int(compute_capability)


def _protocol_on(proto: NcclProtocol, state: int, intra_link: str, compute_capability: float,
              release: tuple[int, int, int]) -> bool:
    """Return whether a protocol is on: NCCL's default turns LL128 on only over NVLink on
    compute capability 7.0, 8.0 and 9.0 GPUs, and only from :data:`NCCL_LL128_SINCE`."""
    if state == 0 or (state == 2 and not (nccl_hw(intra_link) == "nvlink"
                                          and compute_capability in (7.0, 8.0, 9.0))):
        return False
    return not (proto.name == "LL128" and release < NCCL_LL128_SINCE)


NCCL_FLUSH_LATENCY_SINCE = (2, 18, 1)
"""From NCCL 2.18.1-1 tuning.cc adds the network's latency a second time to Simple's steps
between hosts ("Also add the flush extra latency"); ``latencyInter`` itself is there from
2.12.7-1 (NVIDIA/nccl history of src/graph/tuning.cc)."""


def _net_hop_us(base_us: float, proto: str, net_us: float,
                release: tuple[int, int, int] = NCCL_NEWEST) -> float:
    """Return a step between hosts: the table's NET latency plus the network's own, twice
    for Simple from :data:`NCCL_FLUSH_LATENCY_SINCE` (tuning.cc: ``interLat +=
    latencyInter``, and again for the flush). The network's latency counts in every
    release: before 2.12.7 NCCL's tuner did not know it, but its steps paid it."""
    twice = proto == "Simple" and release >= NCCL_FLUSH_LATENCY_SINCE
    return base_us + net_us * (2 if twice else 1)


def nccl_tree_latency(proto: NcclProtocol, ranks: int, nodes: int, intra_link: str,
                      net_us: float = 0.0,
                      release: tuple[int, int, int] = NCCL_NEWEST) -> float:
    """Return the tree's latency under ``proto``, microseconds (``NCCL_SOURCE``):
    ``base + 2 ((ranks/nodes - 1) intra_hop + log2(nodes) net_hop)``: a chain through each
    host's GPUs and a binary tree of depth log2(nodes) between hosts, up and down; a net
    hop adds the network's own latency ``net_us`` (:func:`_net_hop_us`)."""
    assert proto.tree_step_us is not None
    hop = _net_hop_us(proto.tree_step_us["net"], proto.name, net_us, release)
    intra = proto.tree_step_us[nccl_hw(intra_link)]
    return proto.tree_base_us + 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * hop)


_NCCL_TOPOLOGY_HINT = ("NVLS needs NVSwitches with NVLink SHARP (nvlink4-nvswitch, "
                       "nvlink5-nvswitch), compute capability 9.0 and 2+ GPUs per host, and "
                       "across hosts collnet: true; NVLSTree several hosts; CollNet collnet: "
                       "true and several hosts")


def nccl_allowed(algorithm: str, ranks: int, nodes: int, intra_link: str,
                 compute_capability: float, collnet: bool = False,
                 coll: str = "allreduce", nics: int = 1) -> bool:
    """Return whether NCCL's topology allows ``algorithm`` for ``coll`` (``NCCL_CURRENT_SOURCE``).

    Ring everywhere; Tree for allreduce; NVLS with NVSwitches that reduce (NVLink SHARP,
    :attr:`IntraLink.nvls_gbps`: the H100's and later), compute capability 9.0 or above and
    two GPUs per host at least (search.cc: no NVLS graph otherwise; it needs two
    channels), on one host or, with in-network reduction, across hosts (tuning.cc disables
    NVLS across nodes without CollNet); NVLSTree as NVLS, across hosts only, allreduce
    only; CollNetDirect and CollNetChain only across hosts with in-network reduction,
    Direct only with NVSwitch, Chain for allreduce only; for reduce-scatter and allgather
    across hosts NVLS and CollNetDirect also need one NIC per GPU (the heads) and the
    plugin's collective there, which this model grants with ``collnet``; PAT for
    reduce-scatter and allgather with one GPU per host (``ncclPatEnable``), never for
    allreduce.
    """
    link = INTRA_LINKS.get(intra_link)
    nvs = link is not None and link.nvswitch
    ppn = ranks // max(nodes, 1)
    reduce_gather = coll in ("reduce_scatter", "all_gather")
    if algorithm == "Ring":
        return True
    if algorithm == "Tree":
        return coll == "allreduce"
    if algorithm in ("NVLS", "NVLSTree"):
        if not (nvs and link is not None and link.nvls_gbps and compute_capability >= 9.0
                and ppn >= 2):
            return False
        if algorithm == "NVLSTree":
            return nodes > 1 and coll == "allreduce"
        return nodes == 1 or (collnet and (not reduce_gather or nics >= ppn))
    if algorithm == "CollNetDirect":
        return nodes > 1 and collnet and nvs and (not reduce_gather or nics >= ppn)
    if algorithm == "CollNetChain":
        return nodes > 1 and collnet and coll == "allreduce"
    if algorithm == "PAT":
        return reduce_gather and ppn == 1 and compute_capability >= 6.0
    raise ValueError(f"unknown NCCL algorithm {algorithm!r}; available: "
                     f"{list(NCCL_ALGORITHMS)}")


def _nvls_bus_gbytes(coll: str, intra_link: str, ppn: int, compute_capability: float) -> float:
    """Return NCCL's model of an NVLS collective's bus bandwidth inside a host, GB/s.

    As tuning.cc has it (``NCCL_CURRENT_SOURCE``): ``nChannels x bwIntra x nvlsEfficiency x
    (nChannels - 1) / nChannels``, twice that for an allreduce (it pipelines two
    operations), (ppn - 1) / ppn of it otherwise; the NVLS graph has one channel per GPU (at
    most 32) at the fastest of search.cc's speeds whose channels fit in one GPU's NVLink
    bandwidth (:attr:`IntraLink.nvlink_gbytes`).
    """
    link = _lookup(INTRA_LINKS, "intra_link", intra_link)
    nch = min(_NCCL_MAX_NVLS_ARITY, ppn)
    speeds = _SM100_SPEEDS if compute_capability >= 10.0 else _SM90_SPEEDS
    bw = next((s for s in speeds if nch * s <= link.nvlink_gbytes), speeds[-1])
    eff = NCCL_NVLS_EFFICIENCY.get(_cc_major(compute_capability), 0.0)
    intra = bw * eff * (nch - 1) / nch
    intra *= 2.0 if coll == "allreduce" else (ppn - 1) / ppn
    return nch * intra


def _extra_allreduce(name: str, nbytes: float, ranks: int, nodes: int, intra_link: str,
                     compute_capability: float, ring_bus_gbytes: float,
                     fabric: NcclFabric,
                     release: tuple[int, int, int] = NCCL_NEWEST) -> tuple[float, float]:
    """Return (latency us, bandwidth GB/s of ``nbytes``) of an allreduce on NVLS, NVLSTree,
    CollNetDirect or CollNetChain as tuning.cc prices it (Simple only;
    ``NCCL_CURRENT_SOURCE``). The graphs' bandwidths: one GPU's NVLS share
    (:func:`_nvls_bus_gbytes`) inside a host, the host's NICs at line rate across
    (``nics x nic_gbytes``) for the NVLS and CollNet graphs, whose channels go one per head
    (GPU and its NIC); NVLSTree's inter-host bandwidth doubles on two hosts and is capped
    at ``perChMaxNVLSTreeBw`` per channel; CollNetDirect's divides by its GPU-to-NIC
    factor (and 0.85 on compute capability 9.0 and above); the CollNet algorithms' bus
    bandwidth is twice their algorithm bandwidth, the NVLS ones' ranks / (2 (ranks - 1))."""
    ppn = ranks // nodes
    hw = nccl_hw(intra_link)
    lat_tab = _NCCL_SIMPLE_LAT[name]
    net_tab = _NCCL_TREE_NET_SIMPLE_US if ppn == 1 else lat_tab["net"]
    inter_lat = _net_hop_us(net_tab, "Simple", fabric.net_us, release)
    nic_total = fabric.nics * fabric.nic_gbytes
    ratio = ranks / (2 * (ranks - 1))
    if name in ("NVLS", "NVLSTree"):
        intra = _nvls_bus_gbytes("allreduce", intra_link, ppn, compute_capability)
        nch = min(_NCCL_MAX_NVLS_ARITY, ppn)
        if name == "NVLS":
            bus = intra if nodes == 1 else min(intra, nic_total)
            lat = lat_tab[hw] + (inter_lat if nodes > 1 else 0.0)
        else:
            idx = min(nodes, 3) - 1
            cap = nch * _NVLS_TREE_PER_CH.get(_cc_major(compute_capability), (0.0,) * 3)[idx]
            bus = min(intra, nic_total * (2 if nodes <= 2 else 1), cap or math.inf)
            lat = lat_tab[hw] + 2 * _log2i(nodes) * inter_lat
        return lat, bus * ratio
    intra_lat = lat_tab[hw]
    if name == "CollNetDirect":
        nch = min(ppn, fabric.nics, _NCCL_MAX_DIRECT_ARITY + 1)
        factor = ppn / nch
        factor -= (factor - 1) / 2
        bus = min(ring_bus_gbytes, nic_total) / factor
        if compute_capability >= 9.0:
            bus *= 0.85
        lat = 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * 0.4) + inter_lat
    else:
        bus = min(ring_bus_gbytes, nic_total)
        lat = 2 * (ppn - 1) * intra_lat + inter_lat
    return lat, bus * 0.5


# tuning.cc's per-channel bandwidth caps (GB/s per channel of the algorithm's graph, on one,
# two, more hosts), each row with the release it took effect from (NVIDIA/nccl history of
# src/graph/tuning.cc: perChMaxTreeBws from 2.8.3-1, ll128MaxBwPerCh from 2.7.3-1 and per
# compute capability from 2.17.1-1, perChMaxRingLL128Bws and perChMaxTreeLL128Bws from
# 2.18.3-1, Blackwell's rows from 2.25.1-1). A compute capability without a row of its own
# at a release takes the row below it, as tuning.cc's compCapIndex does.
_CapRows = tuple[tuple[tuple[int, int, int], tuple[float, float, float]], ...]
_PER_CH_TREE: dict[int, _CapRows] = {
    7: (((2, 8, 3), (26.5, 18.5, 10.0)),),
    8: (((2, 8, 3), (24.0, 22.5, 16.0)), ((2, 10, 3), (24.0, 23.6, 17.8))),
    9: (((2, 17, 1), (38.7, 41.4, 33.0)), ((2, 18, 3), (38.7, 41.4, 36.0))),
    10: (((2, 25, 1), (77.4, 82.8, 72.0)), ((2, 28, 3), (70.0, 42.8, 24.0))),
}
_LL128_ALLREDUCE = ((2, 7, 3), (16.7,) * 3), ((2, 8, 3), (16.9,) * 3), ((2, 10, 3), (20.0,) * 3)
_PER_CH_RING_LL128: dict[int, _CapRows] = {
    7: _LL128_ALLREDUCE, 8: _LL128_ALLREDUCE,
    9: (((2, 17, 1), (36.7,) * 3),),
    10: (((2, 25, 1), (73.4,) * 3), ((2, 28, 7), (73.4, 34.6, 73.4)),
         ((2, 29, 2), (34.5, 34.6, 34.5)), ((2, 29, 7), (40.0,) * 3)),
}
_PER_CH_TREE_LL128: dict[int, _CapRows] = {
    7: _LL128_ALLREDUCE, 8: _LL128_ALLREDUCE,
    9: (((2, 17, 1), (36.7,) * 3), ((2, 18, 3), (36.7, 36.7, 29.0))),
    10: (((2, 25, 1), (73.4, 73.4, 58.0)), ((2, 28, 3), (55.6, 31.67, 20.0))),
}


_PER_CH_CAPS = {"tree": _PER_CH_TREE, "ring_ll128": _PER_CH_RING_LL128,
                "tree_ll128": _PER_CH_TREE_LL128}


@functools.lru_cache(maxsize=256)
def nccl_per_channel_cap(kind: str, release: tuple[int, int, int], compute_capability: float,
                         nodes: int) -> float | None:
    """Return tuning.cc's cap on one channel's bus bandwidth (GB/s) for ``kind``
    (``"tree"``: a tree allreduce, any protocol; ``"ring_ll128"``, ``"tree_ll128"``: LL128
    on the ring or the tree), or None where ``release`` has none.

    As ``ncclTopoTuneModel`` applies them (``NCCL_CURRENT_SOURCE``): ``busBw = min(busBw x
    0.92, nChannels x perChMaxTreeBw)`` for a tree allreduce, then LL128's ``min(busBw x
    120/128, nChannels x perChMaxTreeLL128Bw)`` (7/9 on one host) on the tree and
    ``min(busBw x 0.92, nChannels x perChMaxRingLL128Bw)`` on the ring, the column by
    hosts (one, two, more), the row by compute capability and release (the tables above;
    before 2.18.3 one LL128 cap served ring and tree, and from 2.7.3 to 2.10.2 it was the
    allreduce's entry of a per-collective table).
    """
    table = _PER_CH_CAPS[kind]
    column = 0 if nodes <= 1 else 1 if nodes == 2 else 2
    for cc in range(max(7, _cc_major(compute_capability)), 6, -1):
        rows = [caps for since, caps in table.get(cc, ()) if release >= since]
        if rows:
            return rows[-1][column]
    return None


def _ring_and_tree(nbytes: float, ranks: int, nodes: int, intra_link: str,
                   compute_capability: float, ring_transfer_s: float, states: dict[str, int],
                   release: tuple[int, int, int], algos: dict[str, int], channels: int,
                   fab: NcclFabric) -> tuple[NcclChoice | None, float]:
    """Return the better of NCCL's ring and tree for an allreduce and its time (see
    :func:`nccl_allreduce`), or (None, inf) where neither is on."""
    ring: NcclChoice | None = None
    graph_channels = fab.nics if nodes > 1 else 0
    if algos["Ring"]:
        name, lat, share = nccl_ring("allreduce", nbytes, ranks, nodes, intra_link,
                                     compute_capability, ring_transfer_s, states, release,
                                     fab.net_us, graph_channels)
        ring = NcclChoice("Ring", name, lat, share, lat + ring_transfer_s / share)
    if not algos["Tree"] or ranks < 2:
        return ring, math.inf if ring is None else ring.time_s
    if release < (2, 5, 0) and ring is not None:
        threshold = _nccl24_tree_threshold(ranks, nodes, intra_link, channels)
        if nbytes > threshold:
            return ring, ring.time_s
        ring = None  # below the threshold NCCL 2.4 runs its trees
    model_bytes = ring_transfer_s * ranks / (2 * (ranks - 1)) / 0.46
    ring_bus = (nbytes * 2 * (ranks - 1) / ranks / ring_transfer_s / 1e9
                if ring_transfer_s > 0 else math.inf)
    tree_bus = 0.92 * ring_bus  # the tuner's tree busBw, before the protocol's share
    if nodes == 2 and fab.intra_gbytes > 0 and ring_transfer_s > 0:
        faster = max(1.0, min(2.0, fab.intra_gbytes / ring_bus))
        model_bytes /= faster
        tree_bus *= faster
    capped = 1.0  # the per-channel caps' share of the uncapped tree's busBw
    cap = (nccl_per_channel_cap("tree", release, compute_capability, nodes)
           if graph_channels else None)
    if cap is not None and tree_bus < math.inf:
        capped = min(1.0, graph_channels * cap / tree_bus)
    ll128_cap = (nccl_per_channel_cap("tree_ll128", release, compute_capability, nodes)
                 if graph_channels else None)
    best, best_time = ring, math.inf if ring is None else ring.time_s
    k = _log2i(int(nbytes) >> 6)
    tree: NcclChoice | None = None
    tree_time = math.inf
    for proto in NCCL_PROTOCOLS:
        if not _protocol_on(proto, states[proto.name], intra_link, compute_capability, release):
            continue
        share = 7 / 9 if proto.name == "LL128" and nodes == 1 else proto.tree_share
        share *= capped
        if proto.name == "LL128" and ll128_cap is not None and tree_bus < math.inf:
            share = min(share, graph_channels * ll128_cap / tree_bus)
        corr = proto.tree_correction[k] if k < len(proto.tree_correction) else 1.0
        lat = nccl_tree_latency(proto, ranks, nodes, intra_link, fab.net_us, release) * 1e-6
        time = lat + model_bytes / (share * corr)
        if time < tree_time:
            tree = NcclChoice("Tree", proto.name, lat, 0.92 * share * corr, time)
            tree_time = time
    if tree is not None and tree_time <= best_time:  # the tree comes first in NCCL's order
        return tree, tree_time
    return best, best_time


def nccl_allreduce(nbytes: float, ranks: int, nodes: int, intra_link: str,
                   compute_capability: float, ring_transfer_s: float,
                   protocols: dict[str, int] | None = None,
                   release: tuple[int, int, int] = NCCL_NEWEST,
                   algorithms: dict[str, int] | None = None,
                   channels: int = 1, fabric: NcclFabric | None = None) -> NcclChoice:
    """Return the algorithm and protocol NCCL's tuner picks for an allreduce of ``nbytes``.

    From 2.5 on, as ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` price them
    (``NCCL_SOURCE``): the ring as :func:`nccl_ring` prices it, and the tree at latency
    :func:`nccl_tree_latency` plus its bytes at 0.92 of the bus bandwidth times the
    protocol's :attr:`NcclProtocol.tree_share` and the size's correction factor, its
    algorithm bandwidth half the bus bandwidth where the ring's is ranks/(2 (ranks-1)) of
    it. Both run over the same graph bandwidth, so the tree's bytes take
    ``ring_transfer_s`` (the simulator's ring of Simple bytes) times ``ranks / (2 (ranks-1))
    / (0.5 x 0.92 x share x correction)``. Then NVLS, NVLSTree, CollNetDirect and
    CollNetChain where the topology allows them (:func:`nccl_allowed`; ``fabric`` says
    whether the network reduces) at :func:`_extra_allreduce`'s latency and bandwidth, with
    the ring's bus bandwidth (``nbytes x 2 (ranks-1)/ranks / ring_transfer_s``) standing
    for the graphs' own inside a host. The least predicted time wins, the first in NCCL's
    order (:data:`NCCL_ALGORITHMS`) among equals. NCCL 2.4 chose by size
    (:func:`_nccl24_tree_threshold`), its trees' protocol as above; before 2.4 only rings.
    ``algorithms`` is :func:`nccl_algorithms`' (``None``: NCCL's default for ``release``).
    Across hosts the tree's busBw and LL128's are held at tuning.cc's per-channel caps
    (:func:`nccl_per_channel_cap`) times the graph's channels, taken as one per NIC of a
    host (``fabric.nics``: the search's channels through the NICs, without
    ``ncclTopoDupChannels``, which src/graph/search.cc applies to a graph whose channels
    carry 25 GB/s or more, as a two-host tree's raised ``bwIntra`` can); on one host the
    graph's channel count is not modelled and no cap applies. Not modelled: LL's
    ``llMaxBw`` and the 0.85 of NCCL's plain (unbalanced) tree pattern. The returned share
    of a tree applies to its physical bytes (the strategy's), 0.92 x share x correction x
    the caps' fraction.

    Raises:
        ValueError: no algorithm that ``algorithms`` leaves on is possible here.
    """
    algos = nccl_algorithms(None, release) if algorithms is None else algorithms
    states = nccl_protocols(None) if protocols is None else protocols
    fab = fabric or NcclFabric()
    best, best_time = _ring_and_tree(nbytes, ranks, nodes, intra_link, compute_capability,
                                     ring_transfer_s, states, release, algos, channels,
                                     fab)
    ring_bus = (nbytes * 2 * (ranks - 1) / ranks / ring_transfer_s / 1e9
                if ring_transfer_s > 0 and ranks > 1 else math.inf)
    k = _log2i(int(nbytes) >> 6)
    for name in ("CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"):
        if not algos.get(name) or ranks < 2 or states["Simple"] == 0 or not nccl_allowed(
                name, ranks, nodes, intra_link, compute_capability, fab.collnet):
            continue
        lat, bw = _extra_allreduce(name, nbytes, ranks, nodes, intra_link,
                                   compute_capability, ring_bus, fab, release)
        if name == "NVLSTree" and compute_capability >= 10.0 and k < 24:
            bw *= NCCL_PROTOCOLS[2].tree_correction[min(k, 22)]
        time = lat * 1e-6 + nbytes / (bw * 1e9)
        if time < best_time:
            best, best_time = NcclChoice(name, "Simple", lat * 1e-6, 1.0, time), time
    if best is None:
        raise ValueError(f"nccl_algo: none of the algorithms on "
                         f"({[a for a, on in algos.items() if on]}) is possible for an "
                         f"allreduce over {ranks} GPUs on {nodes} hosts with {intra_link!r} "
                         f"({_NCCL_TOPOLOGY_HINT})")
    return best


# A ring step between hosts launches a network operation: 1 us on an x86 host (Intel; 2 on
# AMD), three of them per step for Simple; an intra-host step of a multi-host ring costs at
# least that much.
_NCCL_NET_OVERHEAD_US = 1.0


def nccl_ring(coll: str, nbytes: float, ranks: int, nodes: int, intra_link: str,
              compute_capability: float, transfer_s: float,
              protocols: dict[str, int] | None = None,
              release: tuple[int, int, int] = NCCL_NEWEST,
              net_us: float = 0.0, graph_channels: int = 0) -> tuple[str, float, float]:
    """Return the protocol NCCL's tuner picks for a ring collective, its latency and its
    bandwidth factor: ``(name, latency seconds, fraction of Simple's bandwidth)``.

    NCCL's model (``NCCL_SOURCE``): a ring ``coll`` (``"allreduce"``: 2(r-1) steps;
    ``"reduce_scatter"`` or ``"all_gather"``: r-1 steps) over ``ranks`` GPUs on ``nodes``
    hosts costs ``base + (steps - inter) x intra_step + inter x net_step`` (``inter``: 2 x
    nodes steps of an allreduce cross hosts, nodes - 1 of the others; none on one host),
    times 1.9 (compute capability below 8.0) or 1.4 for Simple allreduces across hosts of
    at least 64 bytes per rank, plus its bytes at the protocol's share of the bus bandwidth:
    LL moves 8 bytes per 16 (a quarter of Simple's rate across hosts or in an allreduce, a
    third otherwise), LL128 120 of 128 (0.92 of it; 0.7 with one GPU per host; only over
    NVLink on compute capability 7.0, 8.0 and 9.0 GPUs, where NCCL enables it), Simple all
    of it. The tuner picks the protocol of least time among those ``protocols`` leaves on
    (:func:`nccl_protocols`; ``None``: NCCL's default), LL128 only from
    :data:`NCCL_LL128_SINCE` on (``release``). ``transfer_s`` is the bytes' time
    at Simple's rate (the simulator's ring of the same size). The tree, and the tuner's
    choice between the two, are :func:`nccl_allreduce`'s. Across hosts LL128's busBw is
    held at ``graph_channels`` (the graph's channels, one per NIC) times tuning.cc's
    per-channel cap (:func:`nccl_per_channel_cap`; 0 channels: no cap). Not modelled: LL's
    ``llMaxBw``, and the number of channels in the plateau's rule (its 64 bytes per rank
    are counted for one channel). A step between hosts adds the network's own latency
    ``net_us`` (:func:`nccl_net_latency_us`; twice for Simple, as tuning.cc adds
    ``latencyInter`` and again for the flush).
    """
    if coll == "allreduce":
        steps = 2 * (ranks - 1)
        inter = 2 * nodes if nodes > 1 else 0
    elif coll in ("reduce_scatter", "all_gather"):
        steps = ranks - 1
        inter = nodes - 1
    else:
        raise ValueError(f"coll: unknown ring collective {coll!r}; available: "
                         "['all_gather', 'allreduce', 'reduce_scatter']")
    states = nccl_protocols(None) if protocols is None else protocols
    best: tuple[str, float, float] | None = None
    best_time = float("inf")
    for proto in NCCL_PROTOCOLS:
        if not _protocol_on(proto, states[proto.name], intra_link, compute_capability, release):
            continue
        intra = proto.step_us[nccl_hw(intra_link)]
        if nodes > 1:
            overhead = _NCCL_NET_OVERHEAD_US * (3 if proto.name == "Simple" else 1)
            intra = max(intra, overhead)
        net = _net_hop_us(proto.step_us["net"], proto.name, net_us, release)
        lat = proto.base_us + (steps - inter) * intra + inter * net
        if (proto.name == "Simple" and nodes > 1 and coll == "allreduce"
                and nbytes / ranks >= 64):
            lat *= 1.9 if compute_capability < 8.0 else 1.4
        if proto.name == "LL":
            share = 1 / 4 if nodes > 1 or coll == "allreduce" else 1 / 3
        elif proto.name == "LL128":
            share = 0.92 if ranks / nodes >= 2 else 0.7
            cap = (nccl_per_channel_cap("ring_ll128", release, compute_capability, nodes)
                   if graph_channels and transfer_s > 0 else None)
            if cap is not None:
                bus = nbytes * steps / ranks / transfer_s / 1e9
                share = min(share, graph_channels * cap / bus)
        else:
            share = 1.0
        time = lat * 1e-6 + transfer_s / share
        if time < best_time:
            best, best_time = (proto.name, lat * 1e-6, share), time
    assert best is not None
    return best


def nccl_collective(coll: str, nbytes: float, ranks: int, nodes: int, intra_link: str,
                    compute_capability: float, transfer_s: float,
                    protocols: dict[str, int] | None = None,
                    release: tuple[int, int, int] = NCCL_NEWEST,
                    algorithms: dict[str, int] | None = None,
                    fabric: NcclFabric | None = None, channels: int = 1) -> NcclChoice:
    """Return the algorithm NCCL's tuner picks for ``coll`` and its predicted time.

    ``coll`` is ``"allreduce"`` (:func:`nccl_allreduce`), ``"reduce_scatter"`` or
    ``"all_gather"``; ``nbytes`` is NCCL's own count of the operation (``nBytes``, the
    whole buffer: for reduce-scatter and allgather ``ranks`` times each rank's part, as
    src/enqueue.cc sets it), ``transfer_s`` the ring's bytes at Simple's rate (``(ranks-1)
    / ranks x nbytes`` over the ring's bus bandwidth for reduce-scatter and allgather). For
    those two, as tuning.cc prices them (``NCCL_CURRENT_SOURCE``): the ring as
    :func:`nccl_ring`; NVLS where :func:`nccl_allowed` lets it (one host, or across hosts
    with in-network reduction and a NIC per GPU) at ``_nvls_bus_gbytes`` (its bandwidth
    taken for the whole ``nbytes``, tuning.cc converts no bus bandwidth for them, and
    across hosts at most the NICs' line rate), latency 25 us (plus a net step across
    hosts); CollNetDirect likewise at ``ranks/nodes x min(ring, 0.9 x NICs)``; PAT with one
    GPU per host at 0.75 of the ring's bus bandwidth, latency 8 us + log2(nodes) x net
    step / 3.5 + 2.8 us x ranks. The least time wins, the first in NCCL's order among
    equals (:data:`NCCL_ALGORITHMS`).

    Raises:
        ValueError: an unknown ``coll``, or no algorithm on is possible.
    """
    algos = nccl_algorithms(None, release) if algorithms is None else algorithms
    if coll == "allreduce":
        return nccl_allreduce(nbytes, ranks, nodes, intra_link, compute_capability, transfer_s,
                              protocols, release, algos, channels, fabric)
    states = nccl_protocols(None) if protocols is None else protocols
    fab = fabric or NcclFabric()
    best: NcclChoice | None = None
    if algos["Ring"]:
        name, lat, share = nccl_ring(coll, nbytes, ranks, nodes, intra_link, compute_capability,
                                     transfer_s, states, release, fab.net_us,
                                     fab.nics if nodes > 1 else 0)
        best = NcclChoice("Ring", name, lat, share, lat + transfer_s / share)
    best_time = math.inf if best is None else best.time_s
    ring_bus = (nbytes * (ranks - 1) / ranks / transfer_s / 1e9
                if transfer_s > 0 and ranks > 1 else math.inf)
    ppn = ranks // nodes
    inter = _net_hop_us(_NCCL_TREE_NET_SIMPLE_US if ppn == 1 else 0.0, "Simple", fab.net_us,
                        release)
    nic_total = fab.nics * fab.nic_gbytes
    for name in ("CollNetDirect", "NVLS", "PAT"):
        if not algos.get(name) or ranks < 2 or states["Simple"] == 0 or not nccl_allowed(
                name, ranks, nodes, intra_link, compute_capability, fab.collnet, coll,
                fab.nics):
            continue
        hop = inter + _NCCL_SIMPLE_LAT[name]["net"] * (ppn > 1)
        if name == "NVLS":
            bw = _nvls_bus_gbytes(coll, intra_link, ppn, compute_capability)
            bw = bw if nodes == 1 else min(bw, nic_total)
            lat = _NCCL_SIMPLE_LAT[name]["nvlink"] + (hop if nodes > 1 else 0.0)
        elif name == "CollNetDirect":
            bw = ppn * min(ring_bus, 0.9 * nic_total)
            lat = 2 * (_NCCL_SIMPLE_LAT[name]["nvlink"] + (ppn - 1) * 0.4) + hop
        else:
            bw = 0.75 * ring_bus
            lat = _NCCL_PAT_BASE_US + _log2i(nodes) * hop / 3.5 + ranks * 2.8
        time = lat * 1e-6 + nbytes / (bw * 1e9)
        if time < best_time:
            best, best_time = NcclChoice(name, "Simple", lat * 1e-6, 1.0, time), time
    if best is None:
        raise ValueError(f"nccl_algo: none of the algorithms on "
                         f"({[a for a, on in algos.items() if on]}) is possible for "
                         f"{coll} over {ranks} GPUs on {nodes} hosts with {intra_link!r} "
                         f"({_NCCL_TOPOLOGY_HINT})")
    return best


def nccl_link_bytes(algorithm: str, nbytes: float, ranks: int, nodes: int,
                    nics: int = 1) -> tuple[float, float]:
    """Return the bytes an allreduce of ``nbytes`` sends through each NIC of a host (the
    hosts' average) and out of each GPU into its intra-host links, by NCCL's algorithm.

    Rail-optimised hosts (GPU i to NIC i mod ``nics``), NCCL's channels spread evenly over
    the NICs, so each NIC carries 1/nics of its host's share. Per host across the network:
    a ring sends ``2 (r-1)/r x nbytes`` (each of its ``2 (r-1)`` steps moves ``nbytes / r``
    over each host's boundary); a tree, and NVLSTree (a tree between hosts for each head's
    shard), ``2 (h-1)/h x nbytes`` on average (each tree edge carries half the message up
    and half down); NVLS across hosts and the CollNet algorithms send the host's reduced
    message once to the switch, ``nbytes``. Per GPU inside the host: a ring ``2 (r-1)/r x
    nbytes`` (the ring's steps whichever link they cross); a tree's chain, and
    CollNetChain, ``nbytes``; NVLS and NVLSTree ``nbytes x (1 + 1/g)`` (``g`` GPUs of a
    host: the switch pulls every GPU's copy of each shard to reduce it, then each GPU
    multicasts its reduced shard); CollNetDirect ``2 (g-1)/g x nbytes`` (a reduce-scatter
    to the heads and an allgather back). None across the network on one host.
    """
    g = ranks // nodes
    h = nodes
    if algorithm == "Ring":
        net, gpu = 2 * (ranks - 1) / ranks * nbytes, 2 * (ranks - 1) / ranks * nbytes
    elif algorithm in ("Tree", "NVLSTree"):
        net = 2 * (h - 1) / h * nbytes
        gpu = nbytes if algorithm == "Tree" else nbytes * (1 + 1 / g)
    elif algorithm == "NVLS":
        net, gpu = float(nbytes), nbytes * (1 + 1 / g)
    elif algorithm == "CollNetChain":
        net, gpu = float(nbytes), float(nbytes)
    elif algorithm == "CollNetDirect":
        net, gpu = float(nbytes), 2 * (g - 1) / g * nbytes
    else:
        raise ValueError(f"algorithm: {algorithm!r} has no allreduce; available: "
                         f"{[a for a in NCCL_ALGORITHMS if a != 'PAT']}")
    if h == 1:
        net = 0.0
    if g == 1:
        gpu = 0.0
    return net / nics, gpu


def _lookup(table: dict[str, _T], kind: str, name: str) -> _T:
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {kind} {name!r}; available: {sorted(table)}") from None


def overlap_slowdown_of(name: str | None) -> float:
    """Return the overlap slowdown of device ``name`` (0 for none or an unknown name, which
    the point's own validation reports)."""
    dev = DEVICES.get(name) if name else None
    return dev.overlap_slowdown if dev is not None else 0.0


def device(name: str) -> Device:
    """Return the device called ``name`` (an unknown one raises, listing the known)."""
    return _lookup(DEVICES, "device", name)


def transport(name: str) -> Transport:
    """Return the transport called ``name`` (an unknown one raises, listing the known)."""
    return _lookup(TRANSPORTS, "transport", name)


def intra_link(name: str) -> IntraLink:
    """Return the intra-host link called ``name`` (an unknown one raises, listing the known)."""
    return _lookup(INTRA_LINKS, "intra_link", name)


def _peak_ratio(a: float, ref: Device, dev: Device, precision: str = "fp32") -> float:
    """Return t_dev / t_ref by the peaks: ``a F_ref / F_dev + (1 - a) M_ref / M_dev``, ``F``
    the peaks at ``precision``."""
    if precision == "fp32":
        return a * ref.fp32_tflops / dev.fp32_tflops + (1.0 - a) * ref.mem_gbps / dev.mem_gbps
    f_ref, f_dev = _peak(ref, precision), _peak(dev, precision)
    return a * f_ref / f_dev + (1.0 - a) * ref.mem_gbps / dev.mem_gbps


def _measured_base(a: float, dev: Device) -> tuple[Device, float] | None:
    """Return the measured device ``dev``'s speed comes from and t_dev / t_base, or None."""
    if dev.resnet50:
        return dev, 1.0
    base = DEVICES.get(dev.like) if dev.like else None
    if base is None or not base.resnet50:
        return None
    return base, _peak_ratio(a, base, dev)


def _time_ratio(a: float, ref: Device, dev: Device, precision: str = "fp32") -> float:
    """Return t_dev / t_ref at an unbounded batch: measured speeds where both devices have
    them (directly or through :attr:`Device.like`), else the peak rule; a profile taken at
    another precision than fp32 always by the peak rule at its precision (the measured
    speeds are fp32 ones)."""
    if ref is dev:
        return 1.0
    if precision != "fp32":
        return _peak_ratio(a, ref, dev, precision)
    r, d = _measured_base(a, ref), _measured_base(a, dev)
    if r is None or d is None:
        return _peak_ratio(a, ref, dev)
    speed_r, speed_d = r[0].speed(), d[0].speed()
    assert speed_r is not None and speed_d is not None
    return d[1] / r[1] * speed_r / speed_d


def compute_factor(matmul_fraction: float, ref: Device, dev: Device, batch: int,
                   new_batch: int, precision: str = "fp32", *, saturation: bool = True) -> float:
    """Return the factor on one iteration's compute times from ``ref``/``batch`` to ``dev``/``new_batch``.

    The rule and its limits are in the module docstring.

    Args:
        matmul_fraction: ``a``, the fraction of the profile's time in matrix products.
        ref: the device the profile was measured on.
        dev: the device to rescale to.
        batch: the profile's per-worker batch.
        new_batch: the point's per-worker batch.
        precision: the precision the profile's times were taken at; both devices compute
            at it (the precision itself changes by :func:`precision_factor`).
        saturation: apply the half-saturation batch; False for samples that are long token
            sequences (time linear in the batch, ``b' / b``).

    Raises:
        ValueError: a fraction outside [0, 1], a batch < 1, or a device without
            ``precision``.
    """
    if not 0.0 <= matmul_fraction <= 1.0:
        raise ValueError(f"matmul_fraction must be in [0, 1], got {matmul_fraction!r}")
    if batch < 1 or new_batch < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch} and {new_batch}")
    speed = _time_ratio(matmul_fraction, ref, dev, precision)
    if not saturation:
        return speed * new_batch / batch
    return speed * (new_batch + dev.saturation_batch) / (batch + ref.saturation_batch)


def _peak(dev: Device, precision: str) -> float:
    """Return ``dev``'s dense peak at ``precision``, or raise naming the devices that have it."""
    peak = dev.peak_tflops(precision)
    if peak is None:
        have = [d.name for d in DEVICES.values() if d.peak_tflops(precision) is not None]
        raise ValueError(f"precision {precision!r}: device {dev.name!r} has no {precision} "
                         f"arithmetic (tensor cores); devices with it: {have}")
    return peak


def matmul_fraction_on(matmul_fraction: float, ref: Device, dev: Device,
                       precision: str = "fp32") -> float:
    """Return the share of time in matrix products once a profile taken on ``ref`` (with
    ``matmul_fraction`` of its time in them) runs on ``dev`` at the same precision, by the
    peak rule: ``a F_ref / F_dev`` over ``a F_ref / F_dev + (1 - a) M_ref / M_dev``."""
    if ref is dev:
        return matmul_fraction
    mm = matmul_fraction * _peak(ref, precision) / _peak(dev, precision)
    rest = (1.0 - matmul_fraction) * ref.mem_gbps / dev.mem_gbps
    return mm / (mm + rest) if mm + rest > 0 else 0.0


def precision_factor(matmul_fraction: float, dev: Device, precision: str,
                     new_precision: str) -> float:
    """Return the factor on compute times on ``dev`` from ``precision`` to ``new_precision``.

    ``t' / t = a x F(p) / F(p') + (1 - a) x B(p') / B(p)``: the share ``a`` of the time in
    matrix products (:func:`matmul_fraction_on` for the device) runs at the ratio of the
    device's dense peaks (:meth:`Device.peak_tflops`), the rest (element-wise kernels,
    normalisations, optimizer) is bound by memory bandwidth and scales with the bytes per
    activation element (:data:`ACTIVATION_BYTES`). The rule and its checks against
    published throughputs: docs/concepts/cluster-model.md.

    Raises:
        ValueError: an unknown precision, or one ``dev`` has no arithmetic for (naming the
            devices that have it).
    """
    for p in (precision, new_precision):
        if p not in ACTIVATION_BYTES:
            raise ValueError(f"unknown precision {p!r}; known: {list(ACTIVATION_BYTES)}")
    if precision == new_precision:
        return 1.0
    if not 0.0 <= matmul_fraction <= 1.0:
        raise ValueError(f"matmul_fraction must be in [0, 1], got {matmul_fraction!r}")
    mm = matmul_fraction * _peak(dev, precision) / _peak(dev, new_precision)
    rest = (1.0 - matmul_fraction) * ACTIVATION_BYTES[new_precision] / ACTIVATION_BYTES[precision]
    return mm + rest


def gradient_bytes(precision: str) -> int:
    """Return the bytes per gradient element that data-parallel training at ``precision``
    communicates (:data:`GRADIENT_BYTES`); ``mixed`` keeps fp32 items (its halving is the
    workload's, see ``simulator.core``)."""
    if precision == "mixed":
        return 4
    try:
        return GRADIENT_BYTES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; known: "
                         f"{[*GRADIENT_BYTES, 'mixed']}") from None
