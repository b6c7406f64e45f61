"""A scheduler rank's process: where it runs (device, cores, priority), its forward worker
thread, and the serve loop that reports readiness or the reason it stopped to the launcher."""

from __future__ import annotations

import logging
import os
import signal
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Protocol

import torch

from sglang.srt.distributed.parallel_state import tp_group_lost
from sglang.srt.distributed.placement import gpu_id, ranks_sharing_gpu, replica_cores, scheduler_name
from sglang.srt.managers.io_struct import SchedulerReady, encode
from sglang.srt.model_executor.model_runner import CUDA_KV_FREE_FRACTION, ModelRunner
from sglang.srt.model_executor.verify_graph_runner import VerifyGraphShape
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Added to the nice value of a CPU scheduler process (all its threads, the forward's OpenMP team
# among them): see yield_cores_to_front_end.
CPU_SCHEDULER_NICE = 10


class ServedScheduler(Protocol):
    """What serve() runs: a scheduler that has loaded its model."""

    def ready_message(self) -> SchedulerReady: ...

    def event_loop(self) -> None: ...


def rank_device(server_args: ServerArgs, dp_rank: int, tp_rank: int) -> torch.device:
    """The GPU placement.gpu_id gives this rank; on CPU all ranks share the host."""
    if server_args.device != "cuda":
        return torch.device(server_args.device)
    args = server_args
    return torch.device(f"cuda:{gpu_id(dp_rank, tp_rank, args.tp_size, args.nnodes, args.base_gpu_id, args.gpu_id_step)}")


def kv_memory_fraction(server_args: ServerArgs, dp_rank: int, tp_rank: int) -> Optional[float]:
    """--mem-fraction-static, split between the ranks that share a GPU (replicas with
    --gpu-id-step 0): each measures the free memory when its own weights are in, so equal
    shares of the fraction never add up to more than it."""
    args = server_args
    if args.device != "cuda":
        return args.mem_fraction_static
    sharing = ranks_sharing_gpu(dp_rank, tp_rank, args.dp_size, args.tp_size, args.nnodes, args.base_gpu_id, args.gpu_id_step)
    if sharing == 1:
        return args.mem_fraction_static
    return (args.mem_fraction_static or CUDA_KV_FREE_FRACTION) / sharing


def start_forward_worker(
    server_args: ServerArgs, device: torch.device, tp_rank: int, dp_rank: int
) -> tuple[ThreadPoolExecutor, ModelRunner]:
    """The forward worker thread and the ModelRunner it loaded. The worker is the only thread of
    this process that runs torch's OpenMP pool; the calling thread only builds batches, single-
    threaded (see init_worker). The model loads on the worker, so that even loading starts no
    OpenMP team on the calling thread."""
    args = server_args
    worker = ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="forward", initializer=init_worker,
        initargs=(device, torch.get_num_threads()),
    )
    torch.set_num_threads(1)
    model_runner = worker.submit(
        ModelRunner,
        args.model_path,
        load_format=args.load_format,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        mem_fraction_static=kv_memory_fraction(args, dp_rank, tp_rank),
        ep_size=args.ep_size,
        cpu_int8_activations=args.cpu_int8_activations,
        sampling_backend=args.sampling_backend,
        quantization=args.quantization,
        **runner_execution_args(args, device, tp_rank),
        watermark=args.watermark_settings(),
        verify_graph=verify_graph_shape(args),
    ).result()
    return worker, model_runner


def verify_graph_shape(args: ServerArgs) -> Optional[VerifyGraphShape]:
    """The verify CUDA graphs of a speculating server: every batch that speculates (up to
    --speculative-disable-batch-size requests, within --cuda-graph-max-bs), W tokens a request."""
    if args.speculative_algorithm is None:
        return None
    max_bs = args.speculative_disable_batch_size
    if args.cuda_graph_max_bs is not None:
        max_bs = min(max_bs, args.cuda_graph_max_bs)
    return VerifyGraphShape(args.speculative_num_draft_tokens, max_bs) if max_bs >= 1 else None


def runner_execution_args(args: ServerArgs, device: torch.device, tp_rank: int) -> dict[str, Any]:
    """The ModelRunner arguments every model of a scheduler shares (the served one, a guide
    model): device and dtype, TP rank, attention backend, CUDA-graph settings, seed."""
    return dict(
        dtype=args.dtype,
        device=str(device),
        context_length=args.context_length,
        tp_rank=tp_rank,
        tp_size=args.tp_size,
        deterministic=args.enable_deterministic_inference,
        attention_backend=args.attention_backend,
        disable_cuda_graph=args.disable_cuda_graph,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        cuda_graph_bs=args.cuda_graph_bs,
        disable_piecewise_cuda_graph=args.disable_piecewise_cuda_graph,
        piecewise_cuda_graph_max_tokens=args.piecewise_cuda_graph_max_tokens or args.chunked_prefill_size,
        piecewise_cuda_graph_tokens=args.piecewise_cuda_graph_tokens,
        random_seed=args.random_seed,
    )


def init_worker(device: torch.device, threads: int) -> None:
    """Initializer of the forward worker thread: its torch threads and its CUDA device."""
    # torch's thread count is per thread under OpenMP. libgomp counts the threads of every team
    # in the process: once they outnumber the cores (a second team, started by one large op on
    # the scheduler thread, is enough on 2 cores), its waiting threads spin only briefly before
    # sleeping, and each of a decode step's hundreds of parallel regions pays a futex wake-up.
    torch.set_num_threads(threads)
    # A new thread starts on CUDA device 0; allocations without an explicit device and NCCL
    # calls of the forward worker must land on this rank's GPU.
    if device.type == "cuda":
        torch.cuda.set_device(device)


def pin_replica_cores(server_args: ServerArgs, dp_rank: int) -> None:
    """On CPU with several replicas, each takes its share of the cores (its torch threads too)."""
    if server_args.device != "cpu" or server_args.dp_size == 1:
        return
    cores = replica_cores(dp_rank, server_args.dp_size)
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    logger.info("CPU cores %s", cores)


def yield_cores_to_front_end(server_args: ServerArgs) -> None:
    """On CPU the HTTP process shares the cores with the forward's OpenMP team, which spins on
    all of them. At equal priority a streamed token waits for the running step's threads to
    use up their time slice before it goes out; a lower priority for the scheduler lets the
    front end run as soon as a result arrives (docs/serving.md). Set before the forward's
    threads start, so they inherit it."""
    if server_args.device != "cpu":
        return
    if not os.path.isdir("/proc/self/task"):
        os.nice(CPU_SCHEDULER_NICE)  # the whole process where priority is per process (macOS)
        return
    for tid in map(int, os.listdir("/proc/self/task")):  # Linux: per thread, imports may have started some
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + CPU_SCHEDULER_NICE, 19))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def serve(
    make_scheduler: Callable[[], ServedScheduler], server_args: ServerArgs, tp_rank: int, ready_writer: Any, dp_rank: int = 0
) -> None:
    """Process body: set up logging, signals, cores and priority, build the scheduler (loading
    the model), report readiness (rank 0) or the start-up error, then run its event loop."""
    name = scheduler_name(dp_rank, tp_rank, server_args.dp_size)
    prefix = f"dp{dp_rank} tp{tp_rank}" if server_args.dp_size > 1 else str(tp_rank)
    logging.basicConfig(level=server_args.log_level.upper(), format=f"[scheduler {prefix}] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C and sends SIGTERM
    logger.info("TP rank %d of %d: pid %d", tp_rank, server_args.tp_size, os.getpid())
    pin_replica_cores(server_args, dp_rank)
    yield_cores_to_front_end(server_args)
    try:
        scheduler = make_scheduler()
    except Exception as err:  # noqa: BLE001 - reported to the launcher verbatim
        ready_writer.send(f"{name} failed to start: {err!r}\n{traceback.format_exc()}")
        raise SystemExit(1) from err
    if tp_rank == 0:
        ready_writer.send(encode(scheduler.ready_message()))
    try:
        scheduler.event_loop()
    except Exception as err:
        _report_stop(err, name, server_args, ready_writer)
        raise


def _report_stop(err: Exception, name: str, server_args: ServerArgs, ready_writer: Any) -> None:
    """Tell the launcher why the event loop ended (its watchdog reports it when the process
    exits); a node other than 0 whose TP group closed exits quietly instead."""
    if not tp_group_lost(err):
        ready_writer.send(f"{name} failed: {type(err).__name__}: {err}")
        return
    if server_args.node_rank > 0:
        # Node 0 stopped (or another node failed, which node 0 reports): this node stops with it.
        logger.info("The TP group closed (%s); this node stops.", err)
        logging.shutdown()
        os._exit(0)  # the forward thread may still wait in a collective of the closed group
    ready_writer.send(f"{name} lost its TP group (a rank on another node stopped, or the network failed): {err}")
