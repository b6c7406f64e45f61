"""Security: --api-key guards every route (/metrics, /health and /openapi.json included), the
sockets between the processes decode msgpack structs only (a pickle sent to them runs nothing and
harms nothing), and custom logit processors stay off unless the server enables them."""

from __future__ import annotations

import os
import pickle
import socket
import struct

import psutil
import pytest
import requests
import zmq

from reliability_utils import API_KEY

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_KEY}"}


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _routes(srv) -> list[tuple[str, str]]:
    document = requests.get(srv.url + "/openapi.json", headers=AUTH, timeout=60).json()
    routes = [(method.upper(), path.replace("{response_id}", "r").replace("{model}", "m"))
              for path, operations in document["paths"].items() for method in operations]
    return routes + [("GET", "/metrics"), ("GET", "/openapi.json")]


def test_every_route_needs_the_api_key(guarded_server):
    routes = _routes(guarded_server)
    assert ("POST", "/generate") in routes and ("POST", "/v1/chat/completions") in routes
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            response = requests.request(method, guarded_server.url + path, headers=headers, json={}, timeout=60)
            assert response.status_code == 401, (method, path, headers, response.status_code)
    metrics = requests.get(guarded_server.url + "/metrics", headers=AUTH, timeout=60)
    assert metrics.status_code == 200 and "sglang:num_running_reqs" in metrics.text


def test_a_pickle_sent_to_the_internal_sockets_runs_nothing(guarded_server, tmp_path):
    marker = str(tmp_path / "pwned")
    payload = pickle.dumps(_Exploit(marker))
    server = psutil.Process(guarded_server.proc.pid)
    paths = {c.laddr for p in [server, *server.children(recursive=True)] for c in p.net_connections(kind="unix")
             if c.laddr and "sglang-ipc-" in c.laddr}
    # Scheduler input, load reports, and the results: ZMQ, except rank 0's results to the
    # tokenizer manager on the CPU default (--detokenizer-mode inline), a length-prefixed socket.
    assert len(paths) >= 3, paths
    context = zmq.Context()
    try:
        for path in paths:
            sock = context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(f"ipc://{path}")
            sock.send(payload)
            sock.close()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                raw.connect(path)
                raw.sendall(struct.pack("<Q", len(payload)) + payload)
    finally:
        context.term()
    out = requests.post(guarded_server.url + "/generate", headers=AUTH, timeout=300,
                        json={"text": "Hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert out.status_code == 200 and len(out.json()["output_ids"]) == 2, out.text
    assert not os.path.exists(marker)


def test_custom_logit_processors_are_refused_unless_enabled(guarded_server):
    response = requests.post(guarded_server.url + "/generate", headers=AUTH, timeout=60,
                             json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "custom_logit_processor": '{"callable": "00"}'})
    assert response.status_code == 400 and "--enable-custom-logit-processor" in response.text, response.text
