"""`python ray_node.py start ...`: Ray's own `ray start`, kept on the loopback address the tests give it.

Ray's CLI replaces `--node-ip-address 127.0.0.1` with the host's outward address (a real cluster's nodes must
reach each other); the test cluster's nodes all run here, so every one of its processes is told 127.0.0.1.
Nothing else changes: the processes are Ray's, started by Ray's CLI.
"""

from __future__ import annotations

import sys

import ray._private.services as services


def _keep(host: str) -> str:
    return host


services.resolve_ip_for_localhost = _keep

if __name__ == "__main__":
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[1:]]
    main()
