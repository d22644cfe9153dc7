"""The hand strategies a planning call may name: `autopar.plan`'s `strategy` and
`hand_strategies` options checked against the mesh before anything is captured, and the
options Megatron 3D chooses itself refused when it is named."""

from __future__ import annotations

from autopar.errors import ShardingError
from autopar.planning.hand_strategies import MEGATRON_3D, standard_hand_strategies
from autopar.values.mesh import Mesh


def _check_strategy_name(strategy: str | None, mesh: Mesh) -> None:
    """Raise `ShardingError` unless `strategy` (the `strategy` option of `autopar.plan`) is
    None or the name of a standard hand strategy that applies to `mesh`, or of Megatron 3D
    on a mesh of two axes or more."""
    if strategy is None:
        return
    applicable = [s.name for s in standard_hand_strategies(mesh) if s.roles is not None]
    if mesh.ndim >= 2:  # where it has no pipeline axis, `megatron_3d` says why
        applicable.append(MEGATRON_3D)
    if strategy not in applicable:
        raise ShardingError(f"no standard hand strategy {strategy!r} on {mesh.describe()}",
                            expected=f"one of {', '.join(map(repr, applicable))}",
                            got=repr(strategy),
                            fix="pick one of those, or leave strategy unset to let the "
                                "solver choose")


def check_megatron_3d_options(strategy: str | None, *, microbatches: object,
                              pipeline: object, constraints: object) -> None:
    """Raise `ShardingError` when `strategy` is Megatron 3D and `autopar.plan`'s options
    choose what it chooses itself: the micro-batches, the pipeline, pinned placements."""
    if strategy != MEGATRON_3D:
        return
    if microbatches != "auto" or pipeline != "auto" or constraints:
        raise ShardingError(f"strategy {MEGATRON_3D!r} chooses its own micro-batches, "
                            "pipeline and placements",
                            expected='microbatches and pipeline left at "auto", no constraints',
                            got=f"microbatches={microbatches!r}, pipeline={pipeline!r}, "
                                f"constraints={dict(constraints or {})!r}",
                            fix="drop those options, or leave strategy unset to let the solver "
                                "plan with them")


def check_hand_strategy_names(asked: bool | tuple[str, ...], mesh: Mesh,
                              strategy: str | None = None, **chosen: object) -> None:
    """Raise `ShardingError` unless `asked` (the `hand_strategies` option of
    `autopar.plan`) is a bool or a tuple of names of standard hand strategies of `mesh`
    or of Megatron 3D (`autopar.planning.pipeline.megatron_3d`), and unless `strategy`
    (its `strategy` option) is None or names a standard hand strategy of `mesh`, or
    Megatron 3D with none of the `chosen` options it chooses itself
    (`check_megatron_3d_options`: microbatches, pipeline, constraints)."""
    _check_strategy_name(strategy, mesh)
    if chosen:
        check_megatron_3d_options(strategy, **chosen)
    if isinstance(asked, bool):
        return
    known = (*(s.name for s in standard_hand_strategies(mesh)), MEGATRON_3D)
    if not isinstance(asked, tuple) or not all(name in known for name in asked):
        raise ShardingError("unknown hand strategies asked for",
                            expected=f"True, False or a tuple of names among {known}",
                            got=repr(asked), fix=f"e.g. hand_strategies=({known[0]!r},)")
