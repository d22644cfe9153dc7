"""Sharded checkpoints of a compiled model and its optimizer, on torch.distributed.checkpoint.

`save(path, pm, optimizer)` writes every rank's own pieces, as DTensors with the plan's
placements on its DeviceMesh, or where a mesh axis's shares cut them at their own offsets
(`autopar.tools.piece_at`) (no gather; DCP writes a replicated piece once), beside a
`autopar.json` holding what the checkpoint is: the parameters and buffers (names, shapes,
dtypes), the optimizer's class, hyperparameters and state kinds, the step, the plan, and
the caller's `extra`. `load(path, pm, optimizer)` reads them into a ParallelModule of any
plan on any mesh (DCP reshards: each rank reads the parts of the saved pieces its own
pieces cover), `load_full(path, model, optimizer)` into a plain single-process model,
`consolidate(path, file)` writes one `torch.save` file of the full tensors.

A checkpoint is committed atomically: the ranks write into `<path>.partial`, and once
every rank's pieces and DCP's metadata are written, rank 0 adds `autopar.json` and renames
the directory to `path` (a checkpoint already there is replaced). A directory without
`autopar.json` is never loaded. With `async_save`, the pieces are copied to memory and
written by a background thread over a process group of their own; `save` returns a
`PendingSave` whose `wait()` blocks until the checkpoint is committed.

State names: a parameter or buffer under its canonical name (the first of a tied group),
an optimizer state under `optim/<parameter>/<state>`. Per-element states (Adam's moments)
are placed like their parameter; scalar ones (the step count) are replicated. PowerSGD's
state (`autopar.runtime.powersgd`), each rank's own, under `compression/<rank>/...`: it
is loaded back where the ranks are as many as saved it, and starts afresh otherwise.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from autopar.errors import CheckpointError
from autopar.tools.piece_at import PieceAt, global_view, in_memory
from autopar.values.placement import Shares

FORMAT = 1
MANIFEST = "autopar.json"
PARTIAL = ".partial"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a committed checkpoint holds: `tensors` the parameters and persistent buffers
    (canonical name -> (shape, dtype)), `optimizer` its class name (None: no optimizer
    state), `step` and `extra` as the caller saved them, `plan` the plan's JSON."""

    tensors: dict[str, tuple[tuple[int, ...], str]]
    optimizer: str | None
    step: int | None
    extra: dict = field(default_factory=dict)
    plan: dict | None = None
    groups: tuple[dict, ...] = ()
    states: dict[str, dict[str, bool]] = field(default_factory=dict)


class PendingSave:
    """An asynchronous save under way: `wait()` (collective) returns on every rank once the
    checkpoint is committed; `done()` says whether this rank's writes have finished."""

    def __init__(self, future: Future | None, commit, group=None) -> None:
        self._future, self._commit, self._group = future, commit, group

    def wait(self) -> None:
        if self._future is None:
            return
        self._future.result()
        self._future = None
        _barrier(self._group)  # every rank's pieces written
        self._commit()
        _barrier(self._group)
        if self._group is not None:
            dist.destroy_process_group(self._group)

    def done(self) -> bool:
        return self._future is None or self._future.done()


def _in_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _in_process_group() else 0


def _barrier(group=None) -> None:
    if _in_process_group():
        dist.barrier(group=group)


def _slots(pm) -> list:
    """The slots a checkpoint holds: parameters and the buffers the state dict keeps."""
    kept = set(pm.state_dict(keep_vars=True))
    return [s for s in pm.slots if s.role != "constant" and any(n in kept for n in s.names)]


def _shares(pm) -> Shares:
    """The shares of the mesh `pm`'s pieces are cut on (a pipelined plan's stage mesh)."""
    plan = pm.plan
    return (plan.pipeline.sub_mesh if plan.pipeline is not None else plan.mesh).shares


def _optimizer_states(optimizer: torch.optim.Optimizer, pm) -> dict[str, dict[str, Any]]:
    """The optimizer's state of each of `pm`'s parameters, by canonical name."""
    names = {id(pm.value(slot)): slot.names[0] for slot in pm.slots if slot.role == "parameter"}
    states = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if id(parameter) not in names:
                raise CheckpointError(
                    "the optimizer steps a tensor that is not one of the model's parameters",
                    expected="an optimizer built on pm.parameters()",
                    got=f"a tensor of shape {tuple(parameter.shape)}",
                    fix="torch.optim.AdamW(pm.parameters(), ...)")
            states[names[id(parameter)]] = optimizer.state.get(parameter, {})
    return states


def _dcp_state(pm, optimizer: torch.optim.Optimizer | None,
               kinds: Mapping[str, Mapping[str, bool]] | None = None) -> tuple[dict, dict]:
    """The DCP state dict of this rank's pieces (their own storage: DCP saves from it and
    loads into it), and the kinds of optimizer state (per parameter: state name -> placed
    like the parameter). To save, `kinds` is None and comes from the optimizer's state; to
    load, it is the checkpoint's, and states the optimizer lacks are created (`_with_states`)."""
    mesh, shares = pm.device_mesh, _shares(pm)
    slots = {slot.names[0]: slot for slot in _slots(pm)}
    state = {name: global_view(pm.value(slot).detach(), slot.placements, slot.shape, mesh, shares)
             for name, slot in slots.items()}
    found: dict[str, dict[str, bool]] = {}
    if optimizer is None:
        return state, found
    for name, held in _optimizer_states(optimizer, pm).items():
        slot, parameter = slots[name], pm.value(slots[name])
        if kinds is None:
            found[name] = {key: isinstance(value, torch.Tensor) and value.dim() > 0
                           and value.shape == parameter.shape for key, value in held.items()}
            values = {key: value if isinstance(value, torch.Tensor) else torch.tensor(value)
                      for key, value in held.items()}
        else:
            found[name] = dict(kinds.get(name, {}))
            values = _with_states(optimizer, parameter, found[name])
        for key, placed in found[name].items():
            value = values[key]
            state[f"optim/{name}/{key}"] = (
                global_view(value, slot.placements, slot.shape, mesh, shares) if placed
                else value)
    return state, found


def _with_states(optimizer: torch.optim.Optimizer, parameter: torch.Tensor,
                 kinds: Mapping[str, bool]) -> dict:
    """`optimizer`'s state of `parameter`, with each state `kinds` names that it lacks
    created as zeros (shaped like the parameter where placed, a scalar otherwise)."""
    held = optimizer.state[parameter]  # torch's state is a defaultdict
    for key, placed in kinds.items():
        if key not in held:
            held[key] = torch.zeros_like(parameter.data) if placed else torch.zeros(())
    return held


def _groups(optimizer: torch.optim.Optimizer | None) -> tuple[dict, ...]:
    """The optimizer's hyperparameters per group (JSON values only, no parameters)."""
    if optimizer is None:
        return ()
    return tuple({k: v for k, v in group.items() if k != "params"
                  and isinstance(v, (int, float, bool, str, type(None), list, tuple))}
                 for group in optimizer.param_groups)


def save(path: str | os.PathLike, pm, optimizer: torch.optim.Optimizer | None = None, *,
         step: int | None = None, extra: Mapping | None = None,
         async_save: bool = False) -> PendingSave:
    """Save `pm`'s pieces (and `optimizer`'s state, when given) to directory `path` (see the
    module docstring). Collective: every rank calls it. Returns a `PendingSave`, already
    committed unless `async_save`."""
    path = Path(path)
    staging = path.with_name(path.name + PARTIAL)
    if _rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    _barrier()
    state, kinds = _dcp_state(pm, optimizer)
    state.update(_compression_state(pm))
    tensors = {slot.names[0]: (tuple(slot.shape), str(slot.dtype)) for slot in _slots(pm)}
    tensors, kinds = _everyones(tensors), _everyones(kinds)  # a pipeline rank has its stages'
    info = CheckpointInfo(
        tensors=tensors, optimizer=type(optimizer).__name__ if optimizer is not None else None,
        step=step, extra=dict(extra or {}), plan=pm.plan.to_dict(),
        groups=_groups(optimizer), states=kinds)

    def commit() -> None:
        if _rank() == 0:
            (staging / MANIFEST).write_text(json.dumps(_info_dict(info)))
            # The checkpoint replaced is moved aside first, removed once the new one is in.
            replaced = path.with_name(path.name + ".replaced")
            shutil.rmtree(replaced, ignore_errors=True)
            if path.exists():
                os.replace(path, replaced)
            os.replace(staging, path)
            shutil.rmtree(replaced, ignore_errors=True)

    distributed = _in_process_group()
    if not async_save:
        dcp.save(state, checkpoint_id=str(staging), no_dist=not distributed)
        _barrier()
        commit()
        _barrier()
        return PendingSave(None, lambda: None)
    # A group of its own: the background thread's collectives must not interleave with
    # the training's on the default group.
    group = dist.new_group(backend="gloo") if distributed else None
    # The pieces are copied to memory before it returns: the training may change them
    # while the thread writes. DCP's own copy refuses pieces placed by shares.
    if any(isinstance(value, PieceAt) for value in state.values()):
        thread = ThreadPoolExecutor(max_workers=1)
        future = thread.submit(dcp.save, in_memory(state), checkpoint_id=str(staging),
                               process_group=group, no_dist=not distributed)
        thread.shutdown(wait=False)  # its one job still runs
    else:
        future = dcp.async_save(state, checkpoint_id=str(staging), process_group=group,
                                no_dist=not distributed)
    return PendingSave(future, commit, group)


def _everyones(mine: dict) -> dict:
    """The union of every rank's `mine` (collective when distributed)."""
    if not _in_process_group():
        return mine
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}


def _info_dict(info: CheckpointInfo) -> dict:
    return {"format": FORMAT, "tensors": {k: [list(s), d] for k, (s, d) in info.tensors.items()},
            "optimizer": info.optimizer, "step": info.step, "extra": info.extra,
            "plan": info.plan, "groups": list(info.groups), "states": info.states}


def info(path: str | os.PathLike) -> CheckpointInfo:
    """What the committed checkpoint at `path` holds; `CheckpointError` when there is
    none, or it is incomplete or unreadable."""
    path = Path(path)
    manifest = path / MANIFEST
    if not path.exists():
        staged = path.with_name(path.name + PARTIAL)
        raise CheckpointError(
            f"no checkpoint at {path}", expected="a directory written by autopar.checkpoint"
            ".save", got="an incomplete save (its ranks did not all finish)" if staged.exists()
            else "nothing", fix="pass the directory given to save, or save one first")
    if not manifest.exists() or not (path / ".metadata").exists():
        raise CheckpointError(
            f"{path} is not a complete checkpoint", expected=f"{MANIFEST} and DCP's .metadata "
            "in it (written last, when every rank has written its pieces)",
            got=", ".join(sorted(p.name for p in path.iterdir())) or "an empty directory",
            fix="load an earlier checkpoint; this save did not finish")
    try:
        data = json.loads(manifest.read_text())
        return CheckpointInfo(
            tensors={k: (tuple(s), d) for k, (s, d) in data["tensors"].items()},
            optimizer=data["optimizer"], step=data["step"], extra=data["extra"],
            plan=data["plan"], groups=tuple(data["groups"]), states=data["states"])
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{manifest} is corrupt", expected="the JSON save wrote",
                              got=str(error), fix="load an earlier checkpoint") from error


def _check_model(saved: CheckpointInfo, tensors: dict[str, tuple[tuple[int, ...], str]],
                 path: Path, *, complete: bool = True) -> None:
    """Refuse a checkpoint of another model: names, shapes and dtypes must match (`tensors`
    a part of the model's when not `complete`: a pipeline rank's stages)."""
    missing = sorted(set(tensors) - set(saved.tensors))
    extra = sorted(set(saved.tensors) - set(tensors)) if complete else []
    differ = sorted(name for name in set(tensors) & set(saved.tensors)
                    if (tuple(tensors[name][0]), tensors[name][1])
                    != (tuple(saved.tensors[name][0]), saved.tensors[name][1]))
    if missing or extra or differ:
        got = "; ".join(part for part in (
            f"missing {', '.join(missing[:5])}" if missing else "",
            f"not in the model {', '.join(extra[:5])}" if extra else "",
            "different shape or dtype: " + ", ".join(
                f"{n} {tensors[n]} vs saved {saved.tensors[n]}" for n in differ[:3])
            if differ else "") if part)
        raise CheckpointError(f"the checkpoint at {path} is of another model",
                              expected="the parameters and buffers of the model loading it",
                              got=got, fix="load it into the model it was saved from")


def _check_optimizer(saved: CheckpointInfo, optimizer: torch.optim.Optimizer | None,
                     path: Path) -> None:
    if optimizer is None:
        return
    if saved.optimizer is None:
        raise CheckpointError(f"the checkpoint at {path} has no optimizer state",
                              expected="a checkpoint saved with its optimizer",
                              got="parameters only", fix="load(path, pm) without the optimizer")
    if saved.optimizer != type(optimizer).__name__:
        raise CheckpointError(f"the checkpoint at {path} holds another optimizer's state",
                              expected=saved.optimizer, got=type(optimizer).__name__,
                              fix=f"build a torch.optim.{saved.optimizer} to load it")


def load(path: str | os.PathLike, pm, optimizer: torch.optim.Optimizer | None = None
         ) -> CheckpointInfo:
    """Load the checkpoint at `path` into `pm` (a ParallelModule or PipelinedModule of any
    plan and mesh) and `optimizer` (built on `pm.parameters()`, its hyperparameters set
    from the checkpoint), in place. Collective. Returns what the checkpoint holds (its
    `step` and `extra`)."""
    path = Path(path)
    saved = info(path)
    _check_model(saved, {s.names[0]: (tuple(s.shape), str(s.dtype)) for s in _slots(pm)}, path,
                 complete=pm.plan.pipeline is None)
    _check_optimizer(saved, optimizer, path)
    state, _ = _dcp_state(pm, optimizer, saved.states)
    compression = _saved_compression(pm, saved, path)
    state.update(compression)
    _read(state, path, no_dist=not _in_process_group())
    if compression:
        prefix = f"compression/{_rank()}/"
        pm.low_rank.load_state_dict({k[len(prefix):]: v for k, v in compression.items()})
    _restore_groups(optimizer, saved)
    _barrier()
    return saved


def _read(state: dict, path: Path, *, no_dist: bool) -> None:
    try:
        with warnings.catch_warnings():  # one process is what no_dist says
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path), no_dist=no_dist)
    except (Exception, CheckpointException) as error:  # a file missing or cut short
        raise CheckpointError(f"the checkpoint at {path} can't be read",
                              expected="every file DCP's metadata names, whole",
                              got=f"{type(error).__name__}: {str(error)[:300]}",
                              fix="load an earlier checkpoint") from error


def _compression_state(pm) -> dict[str, torch.Tensor]:
    """This rank's compression state, under its DCP names (module docstring)."""
    low_rank = getattr(pm, "low_rank", None)
    if low_rank is None:
        return {}
    return {f"compression/{_rank()}/{k}": v for k, v in low_rank.state_dict().items()}


def _saved_compression(pm, saved: CheckpointInfo, path: Path) -> dict[str, torch.Tensor]:
    """Tensors to read this rank's saved compression state into, as DCP's metadata
    lists them: none where the checkpoint's plan ran on another number of ranks (or `pm`
    has no such state)."""
    world = dist.get_world_size() if _in_process_group() else 1
    if getattr(pm, "low_rank", None) is None or saved.plan is None \
            or math.prod(saved.plan["mesh"]["shape"]) != world:
        return {}
    prefix = f"compression/{_rank()}/"
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {name: torch.empty(held.size, dtype=held.properties.dtype)
            for name, held in metadata.items()
            if name.startswith(prefix) and isinstance(held, TensorStorageMetadata)}


def _restore_groups(optimizer: torch.optim.Optimizer | None, saved: CheckpointInfo) -> None:
    if optimizer is None:
        return
    for group, kept in zip(optimizer.param_groups, saved.groups):
        group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v
                      for k, v in kept.items()})


def load_full(path: str | os.PathLike, model: nn.Module,
              optimizer: torch.optim.Optimizer | None = None) -> CheckpointInfo:
    """Load the checkpoint at `path` into a plain single-process `model` (and `optimizer`
    built on its parameters): every tensor whole. Not collective."""
    path = Path(path)
    saved = info(path)
    named = dict(model.state_dict(keep_vars=True))
    # A tied weight is saved once, under its first name, as named_parameters() lists it.
    canonical = {**dict(model.named_parameters()),
                 **{n: b for n, b in model.named_buffers() if n in named}}
    _check_model(saved, {n: (tuple(t.shape), str(t.dtype)) for n, t in canonical.items()}, path)
    _check_optimizer(saved, optimizer, path)
    state = {name: named[name].data for name in saved.tensors}
    if optimizer is not None:
        for name, kinds in saved.states.items():
            held = _with_states(optimizer, canonical[name], kinds)
            state.update({f"optim/{name}/{key}": held[key] for key in kinds})
    _read(state, path, no_dist=True)
    _restore_groups(optimizer, saved)
    return saved


def step_path(directory: str | os.PathLike, step: int) -> Path:
    """Where a run that checkpoints into `directory` saves its `step`."""
    return Path(directory) / f"step-{step:08d}"


def latest(directory: str | os.PathLike) -> Path | None:
    """The committed checkpoint of the highest step in `directory` (`step_path`), or None
    (an incomplete one, a `.partial` directory or one without its manifest, is passed
    over)."""
    found = [p for p in Path(directory).glob("step-*") if p.is_dir()
             and p.name.removeprefix("step-").isdigit() and (p / MANIFEST).exists()]
    return max(found, key=lambda p: p.name) if found else None


def consolidate(path: str | os.PathLike, file: str | os.PathLike) -> None:
    """Write the checkpoint at `path` as one `torch.save` file of full tensors (the
    parameters and buffers under their names, optimizer states under
    `optim/<parameter>/<state>`), for tools that read plain files."""
    info(Path(path))  # refuse an incomplete one before reading
    dcp_to_torch_save(str(path), str(file))
