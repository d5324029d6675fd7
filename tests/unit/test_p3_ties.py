"""P3's sending-thread queue: priorities -index per parameter, ties as libstdc++'s heap leaves
them under ps-lite's ``<=`` comparator (include/ps/internal/threadsafe_queue.h in P3's fork)."""

from __future__ import annotations

import random
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from ddpbench.rules.sockets import FifoHeap, Sockets, StlHeap, make_queue


def _drain(q: StlHeap | FifoHeap, entries: list[tuple]) -> list:
    for e in entries:
        q.push(e)
    return [q.pop()[-1] for _ in range(len(entries))]


def test_equal_priorities_leave_a_std_priority_queue_with_le_in_heap_order():
    # Worked by hand through std::push_heap / std::pop_heap with below(l, r) = l <= r:
    # pushes 0..4 leave the heap [4, 3, 1, 0, 2]; pops give 4, then 2, 0, 1, 3.
    entries = [(0, i, f"s{i}") for i in range(5)]
    assert _drain(StlHeap(), entries) == ["s4", "s2", "s0", "s1", "s3"]
    assert _drain(FifoHeap(), entries) == ["s0", "s1", "s2", "s3", "s4"]


def test_a_parameters_slices_tie_and_a_better_parameter_still_goes_first():
    # Parameter 1 (priority -1: key -(-1) = 1 in the entry) pushed as x, then parameter 0's
    # two slices y, z (priority 0). By hand: push x -> [x]; push y -> [y, x]; push z ->
    # [z, x, y]; pop z -> [y, x]; pop y; pop x.
    entries = [(1, 0, "x"), (0, 1, "y"), (0, 2, "z")]
    assert _drain(StlHeap(), entries) == ["z", "y", "x"]
    assert _drain(FifoHeap(), entries) == ["y", "z", "x"]


def test_pop_from_an_empty_heap_and_an_unknown_tie_rule_are_errors():
    with pytest.raises(IndexError, match="empty"):
        StlHeap().pop()
    with pytest.raises(ValueError, match="ties must be one of"):
        make_queue("lifo")


_CPP = r"""
#include <cstdio>
#include <queue>
#include <vector>
struct M { int priority; int id; };
struct Compare { bool operator()(M &l, M &r) { return l.priority <= r.priority; } };
int main() {
  std::priority_queue<M, std::vector<M>, Compare> q;
  int op, p, id;
  while (std::scanf("%d %d %d", &op, &p, &id) == 3) {
    if (op == 0) { q.push(M{p, id}); }
    else { std::printf("%d\n", q.top().id); q.pop(); }
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (libstdc++)")
def test_stl_heap_matches_libstdcxx_on_random_pushes_and_pops(tmp_path):
    # The reference is libstdc++ itself: ps-lite's comparator compiled with g++.
    src = tmp_path / "pq.cc"
    src.write_text(_CPP)
    exe = tmp_path / "pq"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    rng = random.Random(7)
    ops, mine, size = [], [], 0
    heap = StlHeap()
    for i in range(3000):
        if size and rng.random() < 0.45:
            ops.append("1 0 0")
            mine.append(heap.pop()[-1])
            size -= 1
        else:
            p = -rng.randrange(6)  # few priorities: many ties
            ops.append(f"0 {p} {i}")
            heap.push((-p, i, i))
            size += 1
    out = subprocess.run([str(exe)], input="\n".join(ops) + "\n", capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert [int(x) for x in out] == mine


def test_sockets_hand_equal_priorities_over_in_heap_order():
    # One idle thread, socket hwm 1 to server 1: slice 0 goes straight into the socket (the
    # thread is idle), slice 1 is held (the socket is full), slices 2..5 wait in the heap.
    # As the wire takes each, the thread hands over the next: 0, 1, then the heap's order
    # for pushes 2..5 (by hand: heap [5, 4, 3, 2]; pops 5, 2, 3, 4).
    for ties, expect in (("heap", [0, 1, 5, 2, 3, 4]), ("fifo", [0, 1, 2, 3, 4, 5])):
        s: Sockets = Sockets(1, ties)
        for i in range(6):
            s.queue((0, i, SimpleNamespace(dst=1, i=i)))
        order = []
        while not s.idle():
            order.append(s.take().i)
        assert order == expect, ties
