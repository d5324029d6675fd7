"""A small machine profile (the fields of ``ddpbench calibrate``'s YAML) for unit tests."""

BASE = {
    "kind": "ddpbench-machine", "host": "box", "measured_at": "2026-11-25T00:00:00Z",
    "cores": 2, "workers": 2, "servers": 2, "latency_us": 2.0, "bandwidth_gbps": 100.0,
    "copy_gbps": 90.0, "sum_gbps": 80.0, "compute_rate": 1.0, "compute_overhead_us": 70.0,
    "ring_step_us": {"blocking": {2: 30.0, 3: 70.0, 4: 110.0},
                     "polled": {2: 30.0, 4: 130.0, 6: 230.0}},
    "backends": {
        "mpi": {"per_message_us": 15.0, "bandwidth_gbps": 16.0, "compute_factor": 1.5},
        "kvstore": {"per_message_us": 150.0, "bandwidth_gbps": 4.0, "compute_factor": 2.0},
    },
}
