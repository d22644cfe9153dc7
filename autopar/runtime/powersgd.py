"""Data-parallel gradient all-reduces as PowerSGD ("powersgd-R",
`autopar.values.compression`), through torch's own PowerSGD communication hook.

`LowRankReducer` collects, per (mesh axis, rank), the gradients of one backward pass in
buckets as DDP packs them (`POWERSGD_BUCKET_BYTES`, DDP's default cap), and hands each
full bucket to `powerSGD_hook` with a `PowerSGDState` per (axis, rank) that lives as long
as the reducer: error feedback and warm start carry over from step to step, keyed by the
bucket's index in its pass, which the backward's fixed order keeps stable. The hook
averages over the group, while the gradients here are partial sums (the loss is already
divided by the global count): the result is scaled back by the group's size, exact for
every rank and rank-R approximation alike (PowerSGD commutes with scaling). Every
`PowerSGDState` runs `POWERSGD_WARMUP` exact steps first (the hook's
`start_powerSGD_iter`), counted here, once per pass.

The hook chains its all-reduces in callbacks, which run on the backend's threads: two
buckets in flight could issue them in another order on another rank (gloo then fails on a
size mismatch). So a bucket starts only once the one before it is done.

Bytes are counted per gradient as the plan charges them (`costs.compression`): the whole
gradient during the warm-up, then its P and Q.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from torch.distributed.device_mesh import DeviceMesh

from autopar.costs.compression import low_rank_bytes
from autopar.runtime.axis_ops import axis_name
from autopar.runtime.counter import CommCounter
from autopar.values.compression import POWERSGD_MIN_RATE, POWERSGD_WARMUP

# DDP's default bucket cap (25 MiB): a bucket that size compresses as DDP's hook would.
POWERSGD_BUCKET_BYTES = 25 << 20


# `state_dict`'s names of the per-bucket tensors a `PowerSGDState` holds.
_HELD = {"error": "error_dict", "p": "p_memory_dict", "q": "q_memory_dict"}


def _restore(state: PowerSGDState, entries: dict[str, torch.Tensor]) -> None:
    """Set `state` from one key's `state_dict` entries ("iter", "<what>/<bucket>")."""
    for what, tensor in entries.items():
        if what == "iter":
            state.iter = int(tensor)
        else:
            kind, index = what.split("/")
            getattr(state, _HELD[kind])[int(index)] = tensor.clone()


class _Bucket:
    """What `powerSGD_hook` reads of DDP's `GradBucket`: the flat buffer, the gradients
    as views into it, the bucket's index in its pass."""

    def __init__(self, index: int, grads: list[torch.Tensor]) -> None:
        self._index = index
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views, offset = [], 0
        for g in grads:
            self._views.append(self._buffer[offset:offset + g.numel()].view(g.shape))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return False  # the reducer counts the passes itself (`LowRankReducer.finish`)


class LowRankReducer:
    """PowerSGD all-reduces of one program's data-parallel gradients (module docstring); a
    plain object its `GradientReducer` owns."""

    def __init__(self, bucket_bytes: int = POWERSGD_BUCKET_BYTES) -> None:
        self.bucket_bytes = bucket_bytes
        self.states: dict[tuple[str, int], PowerSGDState] = {}  # by (axis name, rank)
        self._buckets: dict[tuple[str, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._launched: dict[tuple[str, int], int] = {}  # buckets started in this pass
        # The one bucket in flight (its parameters with their gradients' shapes, the hook's
        # future, the group's size), and those done: (the same with the result).
        self._in_flight: tuple[list, object, int] | None = None
        self._done: list[tuple[list, torch.Tensor, int]] = []
        self._restored: dict[tuple[str, int], dict[str, torch.Tensor]] = {}  # not yet made

    def start(self, parameter: torch.Tensor, grad: torch.Tensor, axis: int, rank: int,
              mesh: DeviceMesh, counter: CommCounter) -> None:
        """Take `parameter`'s gradient `grad` to reduce over mesh axis `axis` as PowerSGD of
        `rank`, its bytes recorded on `counter`."""
        key = (axis_name(mesh, axis), rank)
        state = self._state(key, mesh, axis, rank)
        exact = state.iter < state.start_powerSGD_iter
        counter.record("all_reduce", key[0], "backward",
                       grad.numel() * grad.element_size() if exact
                       else low_rank_bytes(tuple(grad.shape), rank, grad.element_size()))
        bucket = self._buckets.setdefault(key, [])
        bucket.append((parameter, grad))
        if sum(g.numel() * g.element_size() for _, g in bucket) >= self.bucket_bytes:
            self._launch(key)

    def _state(self, key: tuple[str, int], mesh: DeviceMesh, axis: int,
               rank: int) -> PowerSGDState:
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = PowerSGDState(
                mesh.get_group(axis), matrix_approximation_rank=rank,
                start_powerSGD_iter=POWERSGD_WARMUP, min_compression_rate=POWERSGD_MIN_RATE,
                use_error_feedback=True, warm_start=True)
            _restore(state, self._restored.pop(key, {}))
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What PowerSGD carries from step to step, by "<axis>/<rank>/<what>[/<bucket>]":
        the steps counted ("iter"), and per bucket its error ("error") and its P and Q for
        the warm start ("p", "q"). (The hook's random generator only draws the first Q,
        which the warm start then carries.)"""
        out = {}
        for (axis, rank), state in self.states.items():
            out[f"{axis}/{rank}/iter"] = torch.tensor(state.iter)
            for what, held in _HELD.items():
                for index, tensor in getattr(state, held).items():
                    out[f"{axis}/{rank}/{what}/{index}"] = tensor
        return out

    def reset(self) -> None:
        """Start PowerSGD afresh: its warm-up exact steps again, no error, new P and Q."""
        self.states.clear()
        self._restored.clear()

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        """Take up `state_dict()`'s values: now for the states already made, else when
        their first gradient comes."""
        grouped: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        for name, tensor in saved.items():
            axis, rank, what = name.split("/", 2)
            grouped.setdefault((axis, int(rank)), {})[what] = tensor
        for key, entries in grouped.items():
            if key in self.states:
                _restore(self.states[key], entries)
            else:
                self._restored[key] = entries

    def _launch(self, key: tuple[str, int]) -> None:
        self._wait()  # the bucket before first (module docstring)
        bucket = self._buckets.pop(key)
        index = self._launched.get(key, 0)
        self._launched[key] = index + 1
        state = self.states[key]
        future = powerSGD_hook(state, _Bucket(index, [g for _, g in bucket]))
        self._in_flight = ([(p, g.shape) for p, g in bucket], future,
                           state.process_group.size())

    def _wait(self) -> None:
        if self._in_flight is not None:
            bucket, future, size = self._in_flight
            self._done.append((bucket, future.wait(), size))
            self._in_flight = None

    def finish(self) -> None:
        """Reduce what is left, wait, add the sums to the gradients, count the pass."""
        for key in list(self._buckets):
            self._launch(key)
        self._wait()
        done, self._done = self._done, []
        for bucket, flat, size in done:
            flat.mul_(size)
            offset = 0
            for parameter, shape in bucket:
                summed = flat[offset:offset + shape.numel()].view(shape).clone()
                offset += shape.numel()
                if parameter.grad is None:
                    parameter.grad = summed
                else:
                    parameter.grad.add_(summed)
        for key in self._launched:
            self.states[key].iter += 1
        self._launched.clear()
