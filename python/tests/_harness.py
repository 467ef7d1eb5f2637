"""Runs a test body on W ranks the way inference engines do: torch.multiprocessing.spawn, one
process per rank, rank r on GPU r % device_count, the NVSHMEM unique id broadcast with
torch.distributed (gloo), then epkit.nvshmem_init. A failure on any rank fails the test with that
rank's traceback."""

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, init_nvshmem):
    import epkit

    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")  # as the C++ GPU suite runs
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        if init_nvshmem:
            uid = epkit.nvshmem_get_unique_id() if rank == 0 else epkit.nvshmem_alloc_empty_unique_id()
            dist.broadcast(uid, src=0)
            epkit.nvshmem_init(uid, rank, world_size)
        fn(rank, world_size, *args)
        torch.cuda.synchronize()
        # Only on success: finalize is collective, and a rank that raised must exit (so that spawn
        # stops the others) rather than wait in it for peers that never come.
        epkit.nvshmem_finalize()
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size, *args, init_nvshmem=True,
              timeout_s=float(os.environ.get("EPKIT_PY_TEST_TIMEOUT", 300))):
    """fn(rank, world_size, *args) on world_size spawned processes; fn must be a module-level function.
    A run past timeout_s (a hang, e.g. a rank stuck in a collective) is killed and fails."""
    ctx = mp.start_processes(_entry, args=(world_size, _free_port(), fn, args, init_nvshmem), nprocs=world_size,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):  # raises with the failing rank's traceback
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"{fn.__name__} on {world_size} ranks did not finish in {timeout_s:.0f} s")
