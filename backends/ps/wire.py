"""The parameter-server wire format: a header message, and the elements as a second one.

A message is a 56-byte header (:data:`HEADER`) sent with tag :data:`TAG`, followed in the
same MPI message by a small payload where it has one: UTF-8 JSON (configuration,
optimizer) or text (errors). A data message's elements travel as a second MPI message,
tag :data:`TAG_DATA`, sent straight from the array and received straight into the array
the receiver names (a worker's output, a server's per-worker buffer): no copy into or out
of a staging buffer, as ps-lite sends a ``SArray`` without copying it. A push also says
where its elements lie and where their sum is wanted, as addresses modulo 64
(``src_align``, ``dst_align``), so that a server places the buffers it receives into and
answers from at the same offset within a cache line: MPICH's single-copy transfer between
processes runs slower between buffers at different offsets (NumPy's large arrays start 16
bytes into a page, PyTorch's on 64 bytes). MPI keeps the order of messages from one sender
on one tag, so the receiver pairs each data header with the next element message from that
sender. Every message travels on the store's own duplicate
of ``COMM_WORLD`` (dedicated servers) or of the workers' communicator (colocated servers).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ddpbench.api import ReduceOp
from ddpbench.tensor_ops import BFLOAT16

__all__ = [
    "ACK", "BCAST", "BYE", "CONFIG", "DONE", "ERROR", "FLAG_DATA", "FLAG_GATED",
    "FLAG_ACK_ARRIVAL", "FLAG_ACK_ROUND", "FLAG_PRIO_REPLY", "HEADER", "ALIGN",
    "KIND_NAMES", "OPT", "OPT_DONE", "PULL", "PUSH", "PUSHPULL", "REPLY", "TAG", "TAG_DATA", "Msg",
    "json_of", "json_payload", "np_dtype",
]

TAG = 7305
TAG_DATA = 7306  # a data message's elements, right behind its header
# kind, dtype code, op code, flags, priority, key, part, root, count, postscale, t_start,
# src_align, dst_align (then padding)
HEADER = struct.Struct("<BBBBiqiiqddBB6x")
if HEADER.size != 56:  # pragma: no cover - the layout above is fixed
    raise ImportError("the parameter-server header must be 56 bytes (8-byte aligned payload)")

ALIGN = 64
"""The line whose offsets ``src_align`` and ``dst_align`` give (a cache line)."""

# Message kinds. Data kinds carry array elements and go through the paced priority queue.
PUSH, PULL, PUSHPULL, BCAST, REPLY, ACK, DONE, ERROR, CONFIG, OPT, OPT_DONE, BYE = range(12)
KIND_NAMES = ["push", "pull-request", "push", "broadcast", "pull", "ack", "done", "error",
              "config", "optimizer", "optimizer-done", "bye"]
FLAG_GATED = 1  # the sender waits for an arrival acknowledgement (a gate's variant knobs)
FLAG_DATA = 2  # the message carries array elements
FLAG_PRIO_REPLY = 4  # the reply keeps the push's priority (ddpbench's variants; else 0)
FLAG_ACK_ARRIVAL = 8  # acknowledge the push when it arrives (BytePS), then it is pulled
FLAG_ACK_ROUND = 16  # acknowledge the push when every worker's is in (MXNet), then pull

_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64"]
_OPS = [op.value for op in ReduceOp]


_DTYPE_CODE = {name: i for i, name in enumerate(_DTYPES)}
_OP_CODE = {op: i for i, op in enumerate(_OPS)}
_NP_DTYPES: dict[str, np.dtype] = {}  # every message asks: remembered


def np_dtype(name: str) -> np.dtype:
    """Return the NumPy dtype called ``name`` on the wire (bfloat16 from ml_dtypes)."""
    dtype = _NP_DTYPES.get(name)
    if dtype is None:
        if name == "bfloat16":
            if BFLOAT16 is None:  # pragma: no cover - ml_dtypes is a declared dependency
                raise TypeError("bfloat16 needs the ml_dtypes package")
            dtype = BFLOAT16
        else:
            dtype = np.dtype(name)
        _NP_DTYPES[name] = dtype
    return dtype


class Msg:
    """One message, outgoing or delivered.

    Besides the header fields, an outgoing message carries what only its sender needs: the
    gate it counts against (``gate``, ``cost``), a callback run once it has left
    (``after_send``), its sequence number and the label the send trace gives it.
    """

    __slots__ = ("kind", "src", "dst", "key", "part", "priority", "root", "count", "dtype",
                 "op", "postscale", "flags", "payload", "t_start", "t_enq", "gate", "cost",
                 "after_send", "seq", "label", "direct", "sunk", "src_align", "dst_align")

    def __init__(self, kind: int, dst: int, key: int = 0, part: int = 0, *, priority: int = 0,
                 payload: Any = None, dtype: str = "uint8", op: str = "sum",
                 postscale: float = 1.0, root: int = -1, flags: int = 0) -> None:
        self.kind, self.dst, self.key, self.part = kind, dst, key, part
        self.priority, self.payload, self.dtype, self.op = priority, payload, dtype, op
        self.postscale, self.root, self.flags = postscale, root, flags
        self.count = 0 if payload is None else int(payload.size)
        self.src = -1
        self.t_start = self.t_enq = 0.0
        self.gate: Any = None  # the transport's Gate it counts against, if any
        self.cost = 1.0
        self.after_send: Callable[[], None] | None = None
        self.seq = 0
        self.label = KIND_NAMES[kind]
        self.direct = False  # a server's reply that bypasses the sending thread's queue
        self.sunk = False  # received straight into the buffer its receiver named
        # Where a push's elements lie and where their sum goes, modulo ALIGN (the wire doc).
        self.src_align = self.dst_align = 0

    @property
    def nbytes(self) -> int:
        """Payload bytes of a data message (what pacing, traces and byte counts see)."""
        if not self.flags & FLAG_DATA or self.payload is None:
            return 0
        return int(self.payload.nbytes)

    def encode(self) -> np.ndarray | bytes:
        """Return the header message: the header, and a control message's payload behind it.

        A data message's elements are not in it: send :meth:`data` as the next message.
        """
        head = HEADER.pack(self.kind, _DTYPE_CODE[self.dtype], _OP_CODE[self.op], self.flags,
                           self.priority, self.key, self.part, self.root, self.count,
                           self.postscale, self.t_start, self.src_align, self.dst_align)
        payload = None if self.flags & FLAG_DATA else self.payload
        if payload is None:  # the header alone (every data message)
            return head
        raw = payload.reshape(-1).view(np.uint8)
        buf = np.empty(HEADER.size + raw.size, np.uint8)
        buf[:HEADER.size] = np.frombuffer(head, np.uint8)
        buf[HEADER.size:] = raw
        return buf

    def data(self) -> np.ndarray | None:
        """Return a data message's elements as bytes (a view, no copy), else None.

        A data message always has its element message, empty without a payload, so the
        receiver's posted receive always finds one."""
        if not self.flags & FLAG_DATA:
            return None
        payload = self.payload
        if payload is None:
            return np.empty(0, np.uint8)
        return (payload if payload.ndim == 1 else payload.reshape(-1)).view(np.uint8)

    @classmethod
    def decode(cls, buf: np.ndarray, src: int, dst: int) -> Msg:
        """Return the message whose header message is ``buf``, received from ``src``.

        A data message's payload is set by the receiver, which receives its ``count``
        elements as the next message; a control payload is a view of ``buf``.
        """
        (kind, dt, op, flags, prio, key, part, root, count, post, t_start, src_align,
         dst_align) = HEADER.unpack_from(buf.data)
        msg = cls(kind, dst, key, part, priority=prio, dtype=_DTYPES[dt], op=_OPS[op],
                  postscale=post, root=root, flags=flags)
        body = buf[HEADER.size:]
        msg.count = count
        if not flags & FLAG_DATA and len(body):
            msg.payload = body
        msg.src, msg.t_start = src, t_start
        msg.src_align, msg.dst_align = src_align, dst_align
        return msg


def json_payload(obj: Any) -> np.ndarray:
    """Return ``obj`` as a JSON byte payload (plain data only: no code crosses the wire)."""
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)


def json_of(msg: Msg) -> Any:
    """Return the JSON value a control message carries (None without a payload)."""
    return json.loads(bytes(msg.payload).decode()) if msg.payload is not None else None
