"""The parameter-server backends (``kvstore``, ``p3``, ``byteps``) as one package.

Read it bottom up; each module imports only those above it in this list:

- :mod:`.wire`: the message format (a 56-byte header, then the payload);
- :mod:`.placement`: where each part of an array goes (pure functions, shared with the
  simulator's strategies so both place every byte alike);
- :mod:`.sockets`: P3's sending thread and sockets as one clock-free rule (shared with
  the simulator's sender);
- :mod:`.transport`: the process's uplink and downlink (priority queue, gates, pacing,
  send trace) as the engine's protocol;
- :mod:`.server`: the summation server and the server ranks' loop (:func:`.server.serve`);
- :mod:`.worker`: :class:`~.worker.PSStore`, the worker side (a KVStore);
- :mod:`.kvstore`, :mod:`.p3`, :mod:`.byteps`: the backends, each a PSStore with its
  knobs (:mod:`ddpbench.contract`), placement and send policy.

This file imports nothing, so the placement and socket rules load without MPI.
"""
