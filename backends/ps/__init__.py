"""The parameter-server backends (``kvstore``, ``p3``, ``byteps``) as one package.

Read it bottom up; each module imports only those above it in this list:

- :mod:`.wire`: the message format (a 56-byte header, then the payload);
- :mod:`ddpbench.rules.placement` (outside this package, shared with the simulator's
  strategies so both place every byte alike): where each part of an array goes;
- :mod:`ddpbench.rules.sockets` (shared with the simulator's sender): P3's sending thread
  and sockets as one clock-free rule;
- :mod:`.transport`: the process's uplink and downlink (priority queue, gates, pacing,
  send trace) as the engine's protocol;
- :mod:`.server`: the summation server and the server ranks' loop (:func:`.server.serve`);
- :mod:`.worker`: :class:`~.worker.PSStore`, the worker side (a KVStore);
- :mod:`.kvstore`, :mod:`.p3`, :mod:`.byteps`: the backends, each a PSStore with its
  knobs (:mod:`ddpbench.contract`), placement and send policy.

This file imports nothing, so its modules load one by one (the wire format without MPI).
"""
