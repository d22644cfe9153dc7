"""`autopar.measure`: time and profile a compiled model's training steps on this rank.

    pm = autopar.compile(model, mesh, inputs)
    measured = autopar.measure(pm, inputs, steps=10)     # collective: every rank calls it
    print(autopar.summary(pm.plan, measured=measured))

`measure(pm, inputs)` runs `warmup` untimed training steps (forward, which returns the
loss; `loss.backward()`; the optimizer's `step()` and `zero_grad()`; the loss read, which
waits for its all-reduce), then `steps` timed ones, then `PROFILED_STEPS` under
torch.profiler, and returns this rank's `Measurement` (`autopar.values.measurement`):

- Step times: the timed steps run back to back, as training runs them, after one barrier
  of the default process group (the ranks start the first together); a step's time is
  `time.perf_counter` from the end of the step before it to its own end (after
  `torch.cuda.synchronize()` on CUDA). Steps are not started together one by one: a
  barrier before each costs its own wake-ups, and takes away what a rank that finished
  early gains by starting its next forward while the others finish their optimizer
  step (3 to 12 ms of a 37 to 73 ms GPT step on 2 CPU processes).
- Op groups, from the first profiled step: each op's own time (its children's excluded: CPU
  time, or on CUDA the device time of the kernels it launched), added to the group of the
  op and its callers: inside the optimizer's step (a `record_function` range that
  `measure` puts around `step()` and `zero_grad()`) "optimizer"; inside a collective
  (c10d, gloo and NCCL ops, torch's functional collectives, and autopar's own: the
  `_Redistribute`, `_ReduceLater`, `_GatherKept` and `_ReduceOutput` autograd functions and
  their backward nodes) "collectives"; else "attention" or "matmul" when the op or one of
  its callers is one (`op_group`), "elementwise/other" otherwise. The step's wall time not
  covered is "idle" (Python between ops, waiting outside any op).
- Peak memory over a step: on CUDA the allocator's own statistic
  (`reset_peak_memory_stats`, then `max_memory_allocated`). On CPU there is none: the
  profiler's memory events (`profile_memory=True`: every allocation and free of the CPU
  allocator while it runs, on the threads it follows) give the blocks live at each moment,
  and so the step's own peak above its start (`allocation_peak`; a free on a gloo thread,
  which the profiler misses, ends its block when the address is allocated again), to
  which `start_bytes` adds what is alive when the step starts:
  `autopar.runtime.memory_probe.state_bytes` (parameters, gradients if kept, optimizer
  states, buffers) and the step's inputs. The profiler reports no free of a block
  allocated before it started, so a pre-existing tensor freed during the step is not
  subtracted (the peak errs high by it); memory allocated outside torch's CPU allocator
  (gloo's own buffers) is not seen. Every error of that reading is high (a block counted
  past its free, never a block missed), so the peak is the least over the profiled steps:
  one step's reading of a GPT tensor-parallel step moved between 20.1 and 22.3 MiB from
  run to run, with the gloo threads' timing. `torch.distributed._tools.mem_tracker.MemTracker`
  finds the same peak on a plain matmul chain, but is a dispatch mode around the whole
  step (autopar's `PendingSum` tensor subclass, the collectives, hooks) and refuses a
  module called on more than one step without resetting its statistics; the profiler's
  allocator events see every tensor however it is made (tests/tools/test_measure.py
  checks the chain's hand-computed peak).

Every rank returns its own `Measurement` (`autopar.launch` hands the caller all of them,
in rank order); under torchrun, `all_ranks(measured)` gathers them on every rank. A
pipelined model (`PipelinedModule`) is measured the same way: its call runs the whole
schedule.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._C._profiler import _ExtraFields_Allocation
from torch.profiler import ProfilerActivity, profile, record_function

from autopar.compiler import compile as compile_model
from autopar.errors import TrainingRunError
from autopar.runtime.memory_probe import state_bytes
from autopar.tools.training import LEARNING_RATE, TrainingRun, build, training_loss
from autopar.values.measurement import (
    ATTENTION,
    COLLECTIVES,
    ELEMENTWISE,
    GROUPS,
    IDLE,
    MATMUL,
    OPTIMIZER,
    Measurement,
    op_group,
)
from autopar.values.plan import Plan

# The profiler range `measure` wraps the optimizer's step and zero_grad in, and the one
# of the barrier before the profiled step (inside the profiler, so that the ranks' unequal
# profiler start-up is not waited for within the step; not counted in any group).
OPTIMIZER_RANGE = "autopar.optimizer"
BARRIER_RANGE = "autopar.barrier"
PROFILED_STEPS = 3
# Profiler names of collectives: torch's (c10d ops, the backends' own records, the
# functional collectives) and autopar's autograd functions that run them (`Name` forward,
# `NameBackward` backward).
_COLLECTIVE_PREFIXES = ("c10d::", "c10d_functional::", "_c10d_functional::", "gloo:",
                        "nccl:", "record_param_comms", "_Redistribute", "_ReduceLater",
                        "_GatherKept", "_ReduceOutput")
_EVALUATE = "autograd::engine::evaluate_function: "


def measure(pm: nn.Module, inputs: Iterable, *, steps: int = 10, warmup: int = 2,
            optimizer=None) -> Measurement:
    """This rank's `Measurement` of `pm`'s training step on `inputs` (see the module
    docstring). Collective: every rank of `pm`'s mesh calls it, with the same `steps` and
    `warmup`. `optimizer` (default: AdamW over `pm.parameters()` at autopar's training
    learning rate) is stepped `warmup + steps + PROFILED_STEPS` times, so `pm` trains as it
    is measured. `TrainingRunError` for `steps` below 1 or a negative `warmup`."""
    _check_counts(steps, warmup)
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if optimizer is None:
        optimizer = torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE)
    device = _device_of(pm)
    for _ in range(warmup):
        train_step(pm, inputs, optimizer)
    times = _timed_steps(pm, inputs, optimizer, device, steps)
    start = start_bytes(pm, optimizer, inputs)
    profiled = [_profiled_step(pm, inputs, optimizer, device, start)
                for _ in range(PROFILED_STEPS)]
    wall, groups, _, method = profiled[0]
    peak = min(step[2] for step in profiled)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return Measurement(rank=rank, coordinate=tuple(getattr(pm, "coordinate", ())),
                       device=str(device), warmup=warmup, step_times_s=times,
                       profiled_step_s=wall, groups=groups,
                       group_clock="cuda" if device.type == "cuda" else "cpu",
                       peak_memory_bytes=peak, start_bytes=start, memory_method=method)


def all_ranks(measured: Measurement) -> list[Measurement]:
    """Every rank's measurement, in rank order, on every rank (collective over the default
    process group; `[measured]` without one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [measured]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, measured)
    return every


def _check_counts(steps: int, warmup: int) -> None:
    for name, value, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TrainingRunError(
                f"invalid number of {'timed' if name == 'steps' else 'warm-up'} steps to "
                "measure", expected=f"{name} an int >= {least}", got=f"{name}={value!r}",
                fix=f"e.g. autopar.measure(pm, inputs, {name}={max(least, 2)}), or "
                    "--steps 5 with autopar run --measure")


def _device_of(pm: nn.Module) -> torch.device:
    """The device `pm`'s state lives on (CPU for a module without any)."""
    for tensor in (*pm.parameters(), *pm.buffers()):
        return tensor.device
    return torch.device("cpu")


def train_step(pm: nn.Module, inputs: tuple, optimizer) -> None:
    """One training step as `measure` runs it, and as `autopar.tools.training.train_rank`
    does: forward, backward, the optimizer's `step()` and `zero_grad()` (inside the
    `OPTIMIZER_RANGE` profiler range), then the loss read, which waits for its all-reduce
    (`autopar.runtime.pending.PendingSum`): the step is over when it returns."""
    loss = training_loss(pm(*inputs))
    loss.backward()
    with record_function(OPTIMIZER_RANGE):
        optimizer.step()
        optimizer.zero_grad()
    float(loss.detach())


def _together(device: torch.device) -> None:
    """Wait for this rank's queued device work, then for every rank to get here."""
    _synchronize(device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index if device.index is not None
                                     else torch.cuda.current_device()])
        else:
            dist.barrier()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_steps(pm: nn.Module, inputs: tuple, optimizer, device: torch.device,
                 steps: int) -> tuple[float, ...]:
    """Wall seconds of `steps` training steps run back to back after a barrier, each from
    the end of the one before."""
    _together(device)
    times, last = [], time.perf_counter()
    for _ in range(steps):
        train_step(pm, inputs, optimizer)
        _synchronize(device)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return tuple(times)


def start_bytes(pm: nn.Module, optimizer, inputs: tuple) -> int:
    """Bytes alive when a step starts: `state_bytes` of `pm` and the optimizer
    (parameters, gradients if any, optimizer states and counters, buffers; for an
    `autopar.master_weights` wrapper its inner optimizer's states and the master copies),
    plus the input tensors' storages, each storage once."""
    inner = optimizer if hasattr(optimizer, "state") else getattr(optimizer, "optimizer", None)
    state = state_bytes(pm, inner)
    held = (state.parameters + state.gradient_storages + state.optimizer_states
            + state.optimizer_scalars + state.buffers)
    seen = {p.untyped_storage().data_ptr() for p in pm.parameters()}
    extra = [t for t in (*getattr(optimizer, "masters", ()), *inputs)
             if isinstance(t, torch.Tensor) and t.device.type != "meta"]
    for tensor in extra:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            held += storage.nbytes()
    return held


def _profiled_step(pm: nn.Module, inputs: tuple, optimizer, device: torch.device,
                   start: int) -> tuple[float, tuple[tuple[str, float], ...], int, str]:
    """One more step under torch.profiler: its wall seconds, seconds per group, the peak
    bytes held during it and how that peak was found."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, profile_memory=not cuda) as prof:
        with record_function(BARRIER_RANGE):
            _together(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        train_step(pm, inputs, optimizer)
        _synchronize(device)
        wall = time.perf_counter() - began
    groups = group_seconds(prof.events(), wall, "cuda" if cuda else "cpu")
    if cuda:
        return wall, groups, int(torch.cuda.max_memory_allocated(device)), "cuda allocator"
    return wall, groups, start + allocation_peak(prof), "profiler"


def allocation_peak(prof: profile) -> int:
    """The most bytes the code `prof` profiled (`profile_memory=True`) held at once on the
    CPU above what was alive when profiling started (0 if it never held more): the
    allocator's blocks, allocated and freed in time order (`held_peak`)."""
    blocks: list[tuple[int, int, int]] = []  # (time, signed bytes, address) in tree order

    def walk(node) -> None:
        fields = node.extra_fields
        if isinstance(fields, _ExtraFields_Allocation) and fields.device.type == "cpu":
            blocks.append((node.start_time_ns, fields.alloc_size, fields.ptr))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    # A stable sort: an allocation and a free at the same nanosecond keep their order.
    return held_peak([(size, address) for _, size, address in
                      sorted(blocks, key=lambda block: block[0])])


def held_peak(events: list[tuple[int, int]]) -> int:
    """The highest total of the blocks live at once over `events` (signed bytes, address)
    in time order: an allocation (bytes > 0) makes its address live, a free ends it.

    The profiler records the frees of the threads it follows only: gloo's worker threads
    drop the last reference to a collective's buffers as often as the caller does, and
    those frees are missing. The allocator never hands out an address that is still
    allocated, so an allocation at a live address ends the block there first. A free of a
    block allocated before profiling (none recorded) ends nothing: that block is not in
    the total."""
    live: dict[int, int] = {}
    total = peak = 0
    for size, address in events:
        total -= live.pop(address, 0)
        if size > 0:
            live[address] = size
            total += size
        peak = max(peak, total)
    return peak


def group_seconds(events, wall_s: float, clock: str) -> tuple[tuple[str, float], ...]:
    """Seconds per group of `GROUPS` of the profiled ops `events` (`prof.events()`): each
    op's own time (`clock` "cpu": CPU, "cuda": its kernels' device time) in the group
    `event_group` gives it; "idle" is what of `wall_s` they leave (never negative)."""
    totals = dict.fromkeys(GROUPS, 0.0)
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU or event.name == "[memory]":
            continue  # device kernels are counted through the ops that launched them
        micros = event.self_device_time_total if clock == "cuda" else event.self_cpu_time_total
        if micros > 0:
            group = event_group(event)
            if group is not None:
                totals[group] += micros / 1e6
    totals[IDLE] = max(0.0, wall_s - sum(totals.values()))
    return tuple(totals.items())


def _is_collective(name: str) -> bool:
    return name.removeprefix(_EVALUATE).startswith(_COLLECTIVE_PREFIXES)


def event_group(event) -> str | None:
    """The group of a profiled op (a `FunctionEvent`) from its name and its callers' (see
    the module docstring); None for the barrier before the step and for a range of the
    user's own outside the optimizer, whose own time is Python, counted as idle."""
    names = []
    caller = event
    while caller is not None:
        names.append(caller.name)
        caller = caller.cpu_parent
    if BARRIER_RANGE in names:
        return None
    if OPTIMIZER_RANGE in names:
        return OPTIMIZER
    if any(_is_collective(name) for name in names):
        return COLLECTIVES
    if getattr(event, "is_user_annotation", False):
        return None
    families = {op_group(name) for name in names}
    for group in (ATTENTION, MATMUL):
        if group in families:
            return group
    return ELEMENTWISE


def measure_run(run: TrainingRun, *, warmup: int = 2) -> Measurement:
    """This rank's `measure` of a `autopar.tools.training.TrainingRun`'s model as its ranks
    train it (`autopar run --measure`): built and compiled afresh under `run.plan` (which
    must be set: `plan_run`), stepped by `run.optimizer`, `run.steps` steps timed after
    `warmup`. Collective."""
    assert run.plan is not None, "measure_run needs the run's plan (plan_run)"
    model, inputs = build(run)
    pm = compile_model(model, run.build_mesh(), inputs, plan=Plan.from_dict(run.plan),
                       master_weights=run.master_weights, microbatches=run.microbatches,
                       pipeline=run.pipeline)
    return measure(pm, inputs, steps=run.steps, warmup=warmup, optimizer=run.optimizer(pm))
