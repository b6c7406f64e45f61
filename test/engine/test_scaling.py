"""--dp-size (replicas behind one HTTP server and a data-parallel controller) and --nnodes (a TP
group over two processes standing for two machines), on the CPU with gloo.

Through the real server on a tiny random Qwen3 with SmolLM2's vocabulary: greedy and seeded
(penalised) requests give one replica's tokens with --dp-size 2 and --dp-size 2 --tp-size 2;
shortest_queue and minimum_tokens send work to both replicas (counted by /get_server_info), whose
max_total_num_tokens is both replicas' capacity;
a killed replica fails the in-flight requests naming it, and the server exits. Two nodes give
TP=1's tokens; node 1 stops when node 0 does; a killed node 1 fails node 0's in-flight request
and ends it; a node that cannot join names the address. The balancer, the placement rules and
the flag checks are tested without processes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest
import requests

from engine_utils import iter_stream, running_server
from scaling_utils import PROMPTS, model_flags, save_tiny_full_vocab, scheduler_pid, wait_exit
from sglang.test.server_process import ServerProcess, free_port
from sglang.srt.distributed.placement import (
    gpu_id,
    node_tp_ranks,
    parse_dist_init_addr,
    ranks_sharing_gpu,
    replica_cores,
)
from sglang.srt.managers.data_parallel_controller import LoadBalancer
from sglang.srt.managers.io_struct import ReplicaLoad
from sglang.srt.server_args import ServerArgs
from test_tp import _comparable_requests, _run_concurrently

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPORT_WAIT_S = 30


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("tiny_full_vocab"))
    save_tiny_full_vocab(folder)
    return folder


@pytest.fixture(scope="module")
def one_replica_tokens(tiny_path: str, gguf_path: str) -> list[list[int]]:
    with running_server(*model_flags(tiny_path, gguf_path)) as server:
        return _run_concurrently(server, _comparable_requests(PROMPTS))


# --- without processes ----------------------------------------------------------------------------


def test_round_robin_takes_the_replicas_in_turn() -> None:
    balancer = LoadBalancer("round_robin", 3)
    assert [balancer.pick(10) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_shortest_queue_spreads_a_burst_before_any_report_and_follows_reports() -> None:
    balancer = LoadBalancer("shortest_queue", 2)
    assert [balancer.pick(5) for _ in range(4)] == [0, 1, 0, 1]
    # Replica 0 counted its two requests and has 6 more queued from elsewhere; replica 1 has not
    # counted its two yet, so they still weigh on it.
    balancer.update(ReplicaLoad(dp_rank=0, num_reqs=8, num_waiting_reqs=6, num_tokens=0, num_reqs_received=2))
    assert [balancer.pick(5) for _ in range(6)] == [1] * 6  # 2 in transit + 6 new = 8 before replica 0's turn
    assert balancer.pick(5) == 0  # 8 vs 8: the tie goes round


def test_minimum_tokens_counts_reported_and_in_transit_tokens() -> None:
    balancer = LoadBalancer("minimum_tokens", 2)
    balancer.update(ReplicaLoad(dp_rank=0, num_reqs=1, num_waiting_reqs=0, num_tokens=100, num_reqs_received=0))
    assert balancer.pick(30) == 1
    assert balancer.pick(30) == 1  # 30 in transit < 100
    assert balancer.pick(50) == 1  # 60 < 100
    assert balancer.pick(10) == 0  # 110 > 100
    balancer.update(ReplicaLoad(dp_rank=1, num_reqs=0, num_waiting_reqs=0, num_tokens=0, num_reqs_received=3))
    assert balancer.pick(10) == 1  # its three requests finished: 0 < 100 + 10 in transit


def test_gpu_placement_follows_sglang() -> None:
    # Replica i's ranks follow replica i-1's, gpu_id_step apart, from base_gpu_id.
    assert [gpu_id(d, r, 2, 1, 0, 1) for d in range(2) for r in range(2)] == [0, 1, 2, 3]
    assert [gpu_id(d, r, 2, 1, 4, 2) for d in range(2) for r in range(2)] == [4, 6, 8, 10]
    assert [gpu_id(d, 0, 1, 1, 0, 0) for d in range(2)] == [0, 0]  # step 0: replicas share one GPU
    assert ranks_sharing_gpu(1, 0, 2, 1, 1, 0, 0) == 2 and ranks_sharing_gpu(0, 0, 2, 1, 1, 0, 1) == 1
    # Two nodes: ranks 2, 3 run on node 1, on its GPUs 0, 1 (and replica 1's on 2, 3).
    assert list(node_tp_ranks(4, 2, 1)) == [2, 3]
    assert [gpu_id(d, r, 4, 2, 0, 1) for d in range(2) for r in (2, 3)] == [0, 1, 2, 3]


def test_replicas_split_the_cores() -> None:
    cores = [0, 1, 2, 3, 4]
    assert [replica_cores(d, 2, cores) for d in range(2)] == [[0, 1], [2, 3]]
    assert [replica_cores(d, 3, [0, 1]) for d in range(3)] == [[0], [1], [0]]


def test_bad_parallel_flags_are_refused_naming_the_flag(gguf_path: str) -> None:
    def refused(**fields) -> str:
        with pytest.raises(ValueError) as info:
            ServerArgs(model_path=gguf_path, device="cpu", **fields).resolve()
        return str(info.value)

    assert "--dp-size must be at least 1" in refused(dp_size=0)
    assert "--load-balance-method must be one of round_robin, shortest_queue, minimum_tokens" in refused(
        load_balance_method="minimum_load")
    assert "--node-rank must be in [0, 1]" in refused(nnodes=2, node_rank=2, tp_size=3, dist_init_addr="h:1")
    assert "--tp-size 3 must be a multiple of --nnodes 2" in refused(nnodes=2, tp_size=3, dist_init_addr="h:1")
    assert "--nnodes > 1 needs --dist-init-addr" in refused(nnodes=3, tp_size=3)
    assert "--enable-custom-logit-processor with --nnodes > 1 needs --custom-logit-processor-allowlist" in refused(
        nnodes=2, tp_size=2, dist_init_addr="h:1", enable_custom_logit_processor=True)
    assert "--dist-init-addr must be HOST:PORT, got 'node0'" in refused(dist_init_addr="node0")
    assert parse_dist_init_addr("[::1]:5000") == ("::1", 5000)


# --- through the server ---------------------------------------------------------------------------


def _received(server) -> list[int]:
    loads = requests.get(server.url + "/get_server_info", timeout=30).json()["replica_loads"]
    return [load["num_reqs_received"] for load in loads]


def _served_by_replica(server, before: list[int], total: int) -> list[int]:
    """How many of `total` requests each replica received, once the reports have counted them all
    (each replica reports its final state before it waits idle)."""
    deadline = time.monotonic() + REPORT_WAIT_S
    while True:
        served = [after - b for after, b in zip(_received(server), before)]
        if sum(served) >= total or time.monotonic() > deadline:
            return served
        time.sleep(0.1)


def _check_same_tokens_on_both_replicas(server, reference: list[list[int]]) -> None:
    reqs = _comparable_requests(PROMPTS)
    before = _received(server)
    tokens = _run_concurrently(server, reqs)
    for i, (got, want) in enumerate(zip(tokens, reference)):
        assert got == want, f"request {i} ({reqs[i][1]}): --dp-size 2 {got} != one replica {want}"
    served = _served_by_replica(server, before, len(reqs))
    assert sum(served) == len(reqs) and min(served) > 0, served


def test_dp2_shortest_queue_matches_one_replica_and_a_killed_replica_stops_the_server(
    tiny_path, gguf_path, one_replica_tokens
) -> None:
    flags = [*model_flags(tiny_path, gguf_path), "--dp-size", "2", "--load-balance-method", "shortest_queue"]
    with running_server(*flags) as server:
        assert requests.get(server.url + "/get_load", timeout=30).json()[1]["dp_rank"] == 1
        # The server's KV capacity is both replicas' (the load adds up each replica's own).
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        assert info["max_total_num_tokens"] == info["load"]["max_total_num_tokens"] > 0, info["load"]
        _check_same_tokens_on_both_replicas(server, one_replica_tokens)
        # Two long streams, one per replica (the second goes where the first is not); once both
        # have tokens, replica 1 dies.
        payload = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 800, "ignore_eos": True}}
        streams = [iter_stream(server, payload, timeout=120) for _ in range(2)]
        firsts = [next(s) for s in streams]
        assert all(first["meta_info"]["finish_reason"] is None for first in firsts)
        # The server's gauges add up the replicas: one running request on each.
        load = requests.get(server.url + "/get_server_info", timeout=30).json()["load"]
        assert (load["num_running_reqs"], load["num_queue_reqs"]) == (2, 0), load
        os.kill(scheduler_pid(server, "dp1 tp0"), signal.SIGKILL)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            lasts = list(pool.map(lambda s: list(s)[-1], streams))
        reasons = [last["meta_info"]["finish_reason"] for last in lasts]
        assert all(r["type"] == "abort" and "DP replica 1 scheduler rank 0 exited with code -9" in r["message"]
                   for r in reasons), reasons
        assert wait_exit(server) != 0
    assert "DP replica 1 scheduler rank 0 exited with code -9" in server.output


def test_dp2_tp2_minimum_tokens_matches_one_replica(tiny_path, gguf_path, one_replica_tokens) -> None:
    flags = [*model_flags(tiny_path, gguf_path), "--dp-size", "2", "--tp-size", "2",
             "--load-balance-method", "minimum_tokens"]
    with running_server(*flags) as server:
        _check_same_tokens_on_both_replicas(server, one_replica_tokens)


# --- two nodes on one machine (gloo) --------------------------------------------------------------


def _node(flags: list[str], node_rank: int, dist_port: int, *extra: str) -> ServerProcess:
    port = free_port()
    argv = ["--port", str(port), *flags, "--tp-size", "2", "--nnodes", "2", "--node-rank", str(node_rank),
            "--dist-init-addr", f"127.0.0.1:{dist_port}", *extra]
    return ServerProcess(argv, port, startup_timeout=600)


@contextlib.contextmanager
def two_nodes(flags: list[str]) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Node 1 (scheduler rank 1 only) and node 0 (rank 0, HTTP), meeting at a free local port."""
    dist_port = free_port()
    node1 = _node(flags, 1, dist_port)
    node0 = _node(flags, 0, dist_port)
    try:
        node0.wait_healthy()
        yield node0, node1
    finally:
        node0.stop()
        node1.stop()


def test_two_nodes_match_tp1_and_node1_stops_with_node0(tiny_path, gguf_path, one_replica_tokens) -> None:
    with two_nodes(model_flags(tiny_path, gguf_path)) as (node0, node1):
        tokens = _run_concurrently(node0, _comparable_requests(PROMPTS))
        assert tokens == one_replica_tokens
        node0.proc.send_signal(signal.SIGTERM)
        assert wait_exit(node1) == 0
    assert "The TP group closed" in node1.output and "this node stops" in node1.output, node1.output


def test_killing_node1_fails_the_in_flight_request_and_ends_node0(tiny_path, gguf_path) -> None:
    with two_nodes(model_flags(tiny_path, gguf_path)) as (node0, node1):
        payload = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 800, "ignore_eos": True}}
        stream = iter_stream(node0, payload, timeout=120)
        assert next(stream)["meta_info"]["finish_reason"] is None
        node1.proc.kill()  # its scheduler rank dies with it (PR_SET_PDEATHSIG)
        reason = list(stream)[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "scheduler rank 0 lost its TP group" in reason["message"], reason
        assert wait_exit(node0) != 0
    assert "scheduler rank 0 lost its TP group (a rank on another node stopped" in node0.output, node0.output


def test_a_node_that_cannot_join_names_the_address(tiny_path, gguf_path) -> None:
    dist_port = free_port()  # nobody listens there
    node1 = _node(model_flags(tiny_path, gguf_path), 1, dist_port, "--dist-timeout", "2")
    assert wait_exit(node1, 120) != 0
    assert f"could not join its TP group of 2 ranks at 127.0.0.1:{dist_port} within --dist-timeout 2 s" in node1.output
