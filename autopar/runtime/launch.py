"""Starting ranks: `launch` for tests and demos on one machine, `init_from_env` for torchrun.

Code written as `fn(rank, *args)` runs both ways:

    # train.py
    def main(rank: int) -> None:
        mesh = autopar.runtime.device_mesh(autopar.Mesh((2, 2), ("dp", "tp")))
        ...

    if __name__ == "__main__":
        main(autopar.runtime.init_from_env())    # torchrun --nproc_per_node 4 train.py

    # or, from a test or a notebook: autopar.runtime.launch.launch(main, 4)

`launch` starts `nprocs` CPU processes on this machine (sharing its cores' intra-op threads,
their malloc keeping the memory they free: `autopar.runtime.allocator`), initialises a gloo
process group among them (a TCP store on 127.0.0.1 hosted by the calling process, on a free
port) and returns what each `fn` returned, in rank order. A rank that raises, dies or hangs
never hangs the caller: gloo collectives time out after `timeout` seconds, survivors of a
failure are terminated after `grace` seconds, and `LaunchError` names the rank with its
traceback.
"""

from __future__ import annotations

import multiprocessing.util
import os
import pickle
import queue as queue_module
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autopar.runtime.allocator import keep_freed_memory
from autopar.runtime.errors import LaunchArgumentError, LaunchError, ProcessGroupError

HOST = "127.0.0.1"
# Ranks are forked from a server process that imported these once (multiprocessing's
# forkserver): a rank then starts in a fraction of a second instead of the seconds that
# importing torch takes in every fresh interpreter. The server never runs torch ops, so
# no thread pool or device is inherited across the fork.
PRELOAD = ("torch", "torch.distributed", "torch.export", "autopar.compiler")
# How long after a rank's exit its report may still be in flight in the queue's pipe.
_REPORT_WAIT_S = 1.0
_POLL_S = 0.05


def _run_rank(rank: int, nprocs: int, port: int, fn: Callable, args: tuple, queue,
              timeout_s: float, threads: int, environment: dict[str, str]) -> None:
    """Body of one rank: init gloo, run fn, report (rank, ok, payload)."""
    # The caller's environment as it is now (a forked rank inherited the server's).
    os.environ.clear()
    os.environ.update(environment)
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(nprocs))
    # Ranks share the machine's cores, as torchrun's OMP_NUM_THREADS default intends:
    # oversubscribed intra-op threads make gloo's polling ranks starve each other.
    torch.set_num_threads(threads)
    keep_freed_memory()  # CPU steps would page-fault their tensors in afresh each time
    try:
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(HOST, port, nprocs, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=nprocs,
                                timeout=timeout)
        message = (rank, True, pickle.dumps(fn(rank, *args)))
    except BaseException as error:  # every failure, SystemExit included, goes to the caller
        # The traceback, then the error alone: its message may span lines (an AutoparError
        # says what, expected, got and fix), and the caller shows it whole.
        message = (rank, False, (traceback.format_exc(),
                                 "".join(traceback.format_exception_only(error)).strip()))
    queue.put(message)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        queue.close()
        queue.join_thread()  # the report is in the pipe before the process is gone
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown (seconds with gloo threads around): the result is sent.
        # multiprocessing's own finalizers still run, so that locks the rank created (tqdm's,
        # during capture) are released rather than reported as leaked by the parent.
        multiprocessing.util._run_finalizers(0)
        os._exit(0 if message[1] else 1)


def _exit_text(code: int) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name} without reporting a result"
    return f"exited with code {code} without reporting a result (os._exit, crash or kill)"


def _watch(procs: list, queue, timeout: float, grace: float):
    """Collect reports until every rank reported, `grace` s after a failure, or timeout.

    Returns (results, failures, silent): values and failure texts by rank, and the ranks
    that exited without reporting, in the order seen.
    """
    deadline = time.monotonic() + timeout
    results: dict[int, object] = {}
    failures: dict[int, str] = {}
    exited_at: dict[int, float] = {}
    silent: list[int] = []
    stop_at = None
    while len(results) + len(failures) < len(procs):
        now = time.monotonic()
        if now > deadline or (stop_at is not None and now > stop_at):
            break
        try:
            rank, ok, payload = queue.get(timeout=_POLL_S)
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload  # (traceback, the error's own message)
        except queue_module.Empty:
            for rank, proc in enumerate(procs):
                if rank in results or rank in failures or proc.exitcode is None:
                    continue
                if now - exited_at.setdefault(rank, now) > _REPORT_WAIT_S:
                    text = _exit_text(proc.exitcode)
                    failures[rank] = (text, text)
                    silent.append(rank)
        if failures and stop_at is None:
            stop_at = time.monotonic() + grace
    return results, failures, silent


def _stop(procs: list, wait_s: float) -> None:
    procs = [proc for proc in procs if proc.pid is not None]  # started ones only
    deadline = time.monotonic() + wait_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _failure(nprocs: int, results: dict, failures: dict, silent: list[int],
             timeout: float) -> LaunchError:
    """The error for a failed launch. A rank that died without a word is named first: the
    others' errors are then most likely gloo noticing it is gone."""
    missing = [r for r in range(nprocs) if r not in results and r not in failures]
    if not failures:
        return LaunchError(f"ranks {missing} of {nprocs} did not finish within {timeout} s",
                           failures={r: "timed out" for r in missing},
                           expected=f"every rank to return within timeout={timeout}",
                           got=f"{len(results)} ranks returned",
                           fix="raise timeout=, or look for a rank stuck outside collectives")
    first = silent[0] if silent else next(iter(failures))  # else the first report seen
    summary = failures[first][1]
    texts = {first: failures[first][0], **{r: text for r, (text, _) in failures.items()},
             **{r: "terminated after the failure above" for r in missing}}
    body = "\n".join(f"--- rank {r}: {text.rstrip()}" for r, text in texts.items())
    return LaunchError(f"rank {first} of {nprocs} failed: {summary}", rank=first,
                       failures=texts, expected="every rank to return", got="\n" + body,
                       fix=f"fix the error of rank {first}; ranks failing after it are "
                           "usually waiting on collectives it no longer answers")


def _rank_context():
    """Where ranks come from: the forkserver with `PRELOAD` where the platform has one,
    else fresh interpreters (spawn). Environment variables a rank needs are set by
    `_run_rank`, with the caller's environment: a forked rank inherits the server's."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read once, when the server starts
    return ctx


def launch(fn: Callable, nprocs: int, *args, timeout: float = 300.0,
           grace: float = 5.0) -> list:
    """Run `fn(rank, *args)` on `nprocs` gloo ranks; their return values in rank order.

    `fn` and `args` must be picklable (a module-level function), and so must the results.
    Each rank sees RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT as under
    torchrun, with the default process group already initialised; it is destroyed when
    `fn` returns. Raises `LaunchError` if a rank raises or dies (after letting the others
    report for `grace` s, then terminating them) or if not all finish within `timeout` s.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise LaunchArgumentError("invalid number of processes", expected="an int >= 1",
                                  got=repr(nprocs), fix="e.g. launch(fn, 4)")
    ctx = _rank_context()
    store = dist.TCPStore(HOST, 0, nprocs, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))
    queue = ctx.Queue()
    threads = max(1, (os.cpu_count() or 1) // nprocs)
    procs = [ctx.Process(target=_run_rank, name=f"autopar-rank-{rank}",
                         args=(rank, nprocs, store.port, fn, args, queue, timeout, threads,
                               dict(os.environ)))
             for rank in range(nprocs)]
    results: dict = {}
    try:
        for proc in procs:
            try:
                proc.start()
            except (pickle.PicklingError, AttributeError, TypeError) as error:
                raise LaunchArgumentError(
                    "launch could not send the function or its arguments to a new process",
                    expected="a module-level function and picklable arguments",
                    got=f"{type(error).__name__}: {error}",
                    fix="define fn at the top level of an importable module") from error
        results, failures, silent = _watch(procs, queue, timeout, grace)
    finally:
        _stop(procs, wait_s=10.0 if len(results) == nprocs else 0.0)
        queue.close()
        queue.cancel_join_thread()
        del store
    if len(results) != nprocs:
        raise _failure(nprocs, results, failures, silent, timeout)
    return [results[rank] for rank in range(nprocs)]


def init_from_env(*, timeout: float = 1800.0) -> int:
    """Initialise the default process group from torchrun's environment; return the rank.

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK to pick the GPU); uses
    NCCL when CUDA is available, else gloo, on a CPU rank that keeps the memory it frees
    (`autopar.runtime.allocator`, as `launch`'s ranks do). A no-op returning the rank when a
    group exists (so `fn` may call it under `launch` too).
    """
    if dist.is_initialized():
        return dist.get_rank()
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise ProcessGroupError("torchrun's environment variables are not set",
                                expected="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
                                got=f"missing {missing}",
                                fix="start the script with torchrun --nproc_per_node N, "
                                    "or use autopar.runtime.launch.launch(fn, N)")
    backend = "gloo"
    if torch.cuda.is_available():
        backend = "nccl"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        keep_freed_memory()
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))
    return dist.get_rank()
