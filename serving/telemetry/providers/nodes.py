"""Where a node's GPU samples meet the portal in Redis (GPU_AGENT_MODE=ray): shared by the
sampler in Ray (serving.dataplane.gpu_node) and the relay beside the portal
(serving.gpu_relay); neither Django nor Ray here."""

from __future__ import annotations

import socket


def node_stream(prefix: str, node: str) -> str:
    """The node's samples, one stream entry each (field `d`: the sample as JSON)."""
    return f"{prefix}:gpu:node:{node}"


def nodes_key(prefix: str) -> str:
    """A hash: node name -> its sampler's last report (provider, error, samples)."""
    return f"{prefix}:gpu:nodes"


def node_name(ray_node: str | None) -> str:
    """The host name and the start of the Ray node id: two nodes on one host stay apart."""
    host = socket.gethostname()
    return f"{host}-{ray_node[:8]}" if ray_node else host
