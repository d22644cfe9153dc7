"""What the lowering hands the runtime: a rank's program (`RankProgram`) and the state
slots it runs over (`StateSlot`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from autopar.runtime.recompute import Recompute
from autopar.runtime.redistribution import Redistribution
from autopar.values.placement import Placements


@dataclass(frozen=True)
class StateSlot:
    """One parameter, buffer or constant of the program: its names in the model (canonical
    first, tied names after), role, global shape and dtype, placements on the mesh, and
    (parameters) whether it is trained and the compression of its collectives (a name of
    `autopar.values.compression`, "" for none)."""

    names: tuple[str, ...]
    role: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    placements: Placements
    requires_grad: bool = True
    compression: str = ""


@dataclass(frozen=True, eq=False)
class RankProgram:
    """A rank's program: `module(*local_state, *flat_user_inputs)` -> flat outputs.

    `inputs` holds the global `TensorSpec` of every flat user input (for a non-tensor leaf,
    the example value the graph was specialised to), `outputs` that of every flat output
    (None for a non-tensor one); `collectives` names each inserted
    `Collective` submodule with its edge. `recompute` is the saved-tensor scope of the
    recomputed ops (None without any): run the module inside it; it also does the work of
    the `Regather` scope.
    """

    module: fx.GraphModule
    state: tuple[StateSlot, ...]
    inputs: tuple[object, ...]
    collectives: tuple[tuple[str, Redistribution], ...]
    recompute: Recompute | None = None
    outputs: tuple[object, ...] = ()
