"""Edge costs: the collectives of one edge of the sharding problem for a pair of strategies,
their step seconds, and the tables of them `build_problem` fills its edge matrices from.

An edge (`EdgeRef`) is tensor input `position` of `consumer`, made by `producer`. Its
collectives for a producer strategy and a consumer strategy are `strategy_edge_transfers`
(None: the pair is forbidden), each run once per micro-batch or once per step
(`step_repeats`); the runtime runs some of them in the background of compute
(`background_reductions`, `background_gathers`), and a solve charges those at the
`Background` fractions of their time. `EdgeCache` computes an edge's seconds for every
pair of strategies once per distinct signature and keeps them across the overlap rounds of
`autopar.planning.graph.plan_table`, which change only the charges (`EdgeSecondsTable.charged`).

Memory an edge holds (`held_bytes`, per device). A consumer that keeps what it reads for
its backward (`EdgeRef.keeps`: it saves that input, or it is a view whose output some op
saves) keeps the tensor the edge hands it. When the edge converts (the read placement is
not the output's), that is a new tensor at the read placement, a collective's output or a
local slice copied out (`autopar.runtime.axis_ops.apply_steps` makes it own exactly its
bytes), held from the consumer to the end of the forward:

    copy = local_bytes(nbytes, read)     when read != output

Otherwise the consumer keeps the producer's output itself. A recomputed consumer keeps
both: its backward saves the copy as any op does (recomputation rebuilds its output, not
its inputs), and its recipe keeps the tensor before the conversion, to convert it again in
the backward. The producer charges its output as a node (`build_problem`), except when this
edge is the only way anything keeps it (`EdgeRef.owns`): then the output is freed after the
conversion when there is one (and no recipe keeps it), and the edge holds it otherwise:

    own  = local_bytes(nbytes, output)   `owns`, no copy or a recomputed consumer, and the
                                         producer keeps its output (not recomputed, or the
                                         first block of a tie group)

An edge that owns its producer's output and whose consumer is not recomputed then holds
local_bytes(nbytes, read) whatever the producer chose: a usage of its consumer alone.

So an edge's usage depends on both ends' strategies: it enters the problem as a
`autopar.solver.EdgeUsage` over [consumer, end of the forward). `EdgeCache.held` computes an
edge's matrix once per distinct pair of (output, recompute) and (read, recompute) keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.costs import formulas
from autopar.passes.strategies.find_strategies import Strategy
from autopar.values.mesh import Mesh
from autopar.values.placement import Partial, Replicate, Shard
from autopar.values.specs import TensorSpec


@dataclass(frozen=True)
class EdgeRef:
    """Problem edge `index`: tensor input `position` of `consumer`, made by `producer`."""

    producer: str
    consumer: str
    position: int
    tensor: TensorSpec
    requires_grad: bool
    saved: bool  # a parameter its consumer saves for the backward
    same_block: bool  # both ends in one recompute region (`recompute_region`)
    producer_is_parameter: bool
    consumer_is_view: bool  # the consumer moves no bytes: its value is the input's storage
    consumer_saves: bool  # the consumer keeps this input for its backward (`find_saved`)
    # Memory (`held_bytes`): the consumer keeps what this edge hands it (it saves it, or is
    # a view of it that some op saves), the producer not a parameter; and the producer's
    # output is kept by nothing else (not by the producer, not through another edge).
    keeps: bool = False
    owns: bool = False
    # The producer's output needs no gradient (a user input, a mask): the runtime cuts it
    # by a lone local slice as a view (`Collective`), so a piece along dim 0 is no copy
    # (`sliced_view`).
    producer_off_path: bool = False
    # Time: the bytes of the bucket a replicated parameter's gradient all-reduce is packed
    # into (`formulas.bucketed_time`; 0: alone).
    bucket_bytes: int = 0


@dataclass(frozen=True)
class Background:
    """A fraction of the time of each kind of collective the runtime runs in the
    background of compute: gradient reductions (`background_reductions`), behind the
    backward's, and parameter gathers started ahead (`background_gathers`), behind the
    forward's. The charges of a solve (what its objective counts, the rest expected
    hidden), or the part a plan hides (`extract_plan`)."""

    reductions: float = 1.0
    gathers: float = 1.0


def strategy_edge_transfers(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes,
                            mesh_shape: tuple[int, ...]) -> tuple[formulas.Transfer, ...] | None:
    """The collectives of edge `ref` when its producer chose `src` and its consumer `dst`
    (None: forbidden). A parameter kept gathered (ZeRO-2) must reach its consumer from the
    gathered placement by local steps only (slices, partial reads) and is not gathered
    again for the backward; one gathered at each use (ZeRO-3) is, when its consumer saves
    it.

    A recomputed op reads recomputed inputs from its own region only (`recompute_region`).
    Its output must be what the backward saves, so that the backward rebuilds it (and runs
    its inputs' collectives again, as charged): a consumer that keeps it, or a view of it
    (views carry their base's recompute flag), reads it in its own placement, not a
    collective's copy of it."""
    read = dst.inputs[ref.position]
    if src.gathered is not None and not _reads_gathered(src, read, nbytes, mesh_shape):
        return None
    if ref.consumer_is_view and src.recompute != dst.recompute:
        return None
    if src.recompute and (ref.consumer_saves or ref.consumer_is_view) and read != src.output:
        return None
    if src.recompute and dst.recompute and not ref.same_block and not ref.consumer_is_view:
        return None
    transfers = formulas.edge_transfers(nbytes, src.output, read, dst.output,
                                        mesh_shape, requires_grad=ref.requires_grad,
                                        # Only what the consumer keeps is gathered again
                                        # (a linear keeps its weight, not its bias).
                                        regather=ref.saved and ref.consumer_saves
                                        and src.gathered is None,
                                        recompute=dst.recompute and not ref.consumer_is_view)
    # ZeRO-1 keeps one gathered copy for the step: an edge that gathers it again (for a
    # recomputation) or moves it otherwise than one gather and one scatter can't share it.
    if transfers is not None and src.whole_gradient and (
            dst.recompute or not _gather_and_scatter(transfers)):
        return None
    return transfers


def sliced_view(output, read) -> bool:
    """Whether converting `output` placements to `read` cuts on one mesh axis along dim 0
    alone, whose pieces are contiguous: the runtime hands such a piece of a tensor off the
    gradient path as a view, no copy (`Collective`'s input slices)."""
    changed = [(o, r) for o, r in zip(output, read) if o != r]
    return changed == [(Replicate(), Shard(0))]


def copy_bytes(nbytes, output, read, mesh_shape: tuple[int, ...]):
    """Bytes of the new tensor an edge's forward hands its consumer, converting a tensor of
    `nbytes` from `output` to `read` placements: its local bytes at `read` when they differ
    (a collective's output or a slice copied out), else 0 (the output itself)."""
    return 0 if tuple(output) == tuple(read) else formulas.local_bytes(nbytes, read,
                                                                        mesh_shape)


def held_bytes(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes, mesh_shape: tuple[int, ...],
               *, producer_keeps: bool) -> tuple:
    """(copy, own): the bytes one rank holds for the backward through edge `ref` when its
    producer chose `src` and its consumer `dst` (module docstring), for a tensor of
    `nbytes`. `producer_keeps`: whether the producer's node keeps its output under `src`
    (False when recomputed, except in the first block of a tie group)."""
    if not ref.keeps:
        return 0, 0
    read = dst.inputs[ref.position]
    copy = 0 if ref.producer_off_path and sliced_view(src.output, read) else copy_bytes(
        nbytes, src.output, read, mesh_shape)
    own = formulas.local_bytes(nbytes, src.output, mesh_shape) \
        if ref.owns and (not copy or dst.recompute) and producer_keeps else 0
    return copy, own


def _reads_gathered(src: Strategy, read, nbytes, mesh_shape: tuple[int, ...]) -> bool:
    """Whether a consumer reading `read` uses the copy `src` keeps gathered: it is gathered
    on every axis the copy is (else that axis's gather never runs and the copy is never
    made), and reached from the copy by local steps alone."""
    gathered_axes = [axis for axis, (g, s) in enumerate(zip(src.gathered, src.output)) if g != s]
    return (all(read[axis] != src.output[axis] for axis in gathered_axes)
            and formulas.redistribute(nbytes, src.gathered, read, mesh_shape) == ())


def _gather_and_scatter(transfers: tuple[formulas.Transfer, ...]) -> bool:
    """Whether `transfers` are one forward all-gather and one backward reduce-scatter on
    the same axis (a kept-gathered parameter's edge the runtime overlaps)."""
    return (len(transfers) == 2 and [(t.kind, t.backward) for t in transfers]
            == [("all_gather", False), ("reduce_scatter", True)]
            and transfers[0].axis == transfers[1].axis)


def _replicated_reduction(transfers: tuple[formulas.Transfer, ...]) -> bool:
    return len(transfers) == 1 and transfers[0].backward and transfers[0].kind == "all_reduce"


def background_reductions(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...]
                          ) -> tuple[formulas.Transfer, ...]:
    """The edge's gradient reductions the runtime runs in the background of the rest of
    the backward: a replicated parameter's one all-reduce (as DDP's buckets), or the
    reduce-scatter of a parameter kept gathered over one axis (ZeRO-1/2), whose edge is
    that axis's all-gather and reduce-scatter alone (`autopar.runtime.grad_reduce` carries
    out the same edges)."""
    if not ref.producer_is_parameter:
        return ()
    if _replicated_reduction(transfers):
        return transfers
    if src.gathered is not None and _gather_and_scatter(transfers):
        return transfers[1:]
    return ()


def background_gathers(ref: EdgeRef, src: Strategy,
                       transfers: tuple[formulas.Transfer, ...]) -> tuple[formulas.Transfer, ...]:
    """The edge's gather the runtime starts one use ahead, in the background of the
    forward's compute: a parameter's, gathered at its use (ZeRO-3) or kept gathered
    (ZeRO-2), when it is the edge's only forward collective (`autopar.runtime.prefetch`
    chains the same edges). A ZeRO-1 copy is gathered once per step and not ahead."""
    if not ref.producer_is_parameter or src.whole_gradient:
        return ()
    forward = [t for t in transfers if not t.backward]
    return tuple(forward) if [t.kind for t in forward] == ["all_gather"] else ()


def once_per_step(ref: EdgeRef, src: Strategy,
                  transfers: tuple[formulas.Transfer, ...]) -> tuple[formulas.Transfer, ...]:
    """The edge's transfers a step of several micro-batches runs once, not once per
    micro-batch: a replicated parameter's gradient all-reduce (accumulated until the last
    micro-batch) and a ZeRO-1 parameter's gather and reduce-scatter."""
    if not ref.producer_is_parameter:
        return ()
    if _replicated_reduction(transfers) or src.whole_gradient:
        return transfers
    return ()


def step_repeats(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                 microbatches: int) -> tuple[int, ...]:
    """How many times one training step runs each of the edge's `transfers`."""
    once = {id(t) for t in once_per_step(ref, src, transfers)}
    return tuple(1 if id(t) in once else microbatches for t in transfers)


def transfer_seconds(ref: EdgeRef, transfers: tuple[formulas.Transfer, ...], mesh: Mesh
                     ) -> list:
    """Each of an edge's transfers' time, run once: a replicated parameter's gradient
    all-reduce as its part of a bucket (`EdgeRef.bucket_bytes`), as the runtime packs it."""
    bucket = (ref.bucket_bytes if ref.producer_is_parameter and _replicated_reduction(transfers)
              else 0)
    return [t.time(mesh, bucket) for t in transfers]


def step_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                 microbatches: int, mesh: Mesh) -> list:
    """Each of an edge's transfers' time over one step (`transfer_seconds`, `step_repeats`)."""
    return [n * seconds for seconds, n in zip(transfer_seconds(ref, transfers, mesh),
                                              step_repeats(ref, src, transfers, microbatches))]


def background_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                       seconds) -> tuple:
    """(reductions, gathers): the step seconds of the edge's background reductions and of
    its background gathers, out of `seconds`, its `transfers`' (`step_seconds`)."""
    by_transfer = dict(zip(map(id, transfers), seconds))
    return (sum(by_transfer[id(t)] for t in background_reductions(ref, src, transfers)),
            sum(by_transfer[id(t)] for t in background_gathers(ref, src, transfers)))


def hidden_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                   microbatches: int, mesh: Mesh, hidden: Background):
    """The part of an edge's step time hidden behind compute: its background reductions'
    at `hidden.reductions`, its background gathers' at `hidden.gathers`."""
    reductions, gathers = background_seconds(
        ref, src, transfers, step_seconds(ref, src, transfers, microbatches, mesh))
    return hidden.reductions * reductions + hidden.gathers * gathers


def edge_seconds(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes, mesh: Mesh,
                 microbatches: int) -> tuple | None:
    """(total, reductions, gathers) of edge `ref` when its producer chose `src` and its
    consumer `dst` (None: forbidden, `strategy_edge_transfers`): the step seconds of all its
    transfers and of its background reductions and gathers (`background_seconds`), whatever
    the charges. Under `Background` charges (r, g) the objective counts
    total - ((1 - r) reductions + (1 - g) gathers) (`EdgeSecondsTable.charged`)."""
    transfers = strategy_edge_transfers(ref, src, dst, nbytes, mesh.shape)
    if transfers is None:
        return None
    seconds = step_seconds(ref, src, transfers, microbatches, mesh)
    return (sum(seconds), *background_seconds(ref, src, transfers, seconds))


@dataclass(frozen=True, eq=False)
class EdgeSecondsTable:
    """An edge's `edge_seconds` for every pair of strategies, stored once per distinct value:
    pair (k, m) (producer strategy k, consumer strategy m) has `total[index[k, m]]`,
    `reductions[index[k, m]]` and `gathers[index[k, m]]` (a forbidden pair: inf, 0, 0)."""

    total: np.ndarray
    reductions: np.ndarray
    gathers: np.ndarray
    index: np.ndarray

    def charged(self, charges: Background) -> np.ndarray:
        """The edge's cost matrix under `charges`: per pair,
        total - ((1 - charges.reductions) reductions + (1 - charges.gathers) gathers),
        inf where forbidden (the same floating-point operations as `hidden_seconds` with
        hidden fractions 1 - charges)."""
        hidden = Background(1 - charges.reductions, 1 - charges.gathers)
        seconds = self.total - (hidden.reductions * self.reductions
                                + hidden.gathers * self.gathers)
        return seconds[self.index]


@dataclass(frozen=True, eq=False)
class _Side:
    """One end's strategies grouped by what the edge's cost reads of them: `keys` holds one
    row per distinct group (columns: `EdgeCache._producers_of`, `_consumers_of`),
    `first` the index of a strategy of each group, `of` each strategy's group."""

    keys: np.ndarray
    first: np.ndarray
    of: np.ndarray


# A signature (`EdgeCache._signatures`) packs its forward and backward plan ids in the bits
# above _FLAG_BITS, each in _PLAN_BITS bits, and six flags below.
_FLAG_BITS, _PLAN_BITS = 8, 24
_NO_PLAN, _LOCAL_PLAN = 0, 1  # the ids of `collective_plan`'s None (no plan) and () (local)


class EdgeCache:
    """The edges' `edge_seconds` of the problems built over `mesh`, kept from one
    `build_problem` call to the next (the overlap rounds of
    `autopar.planning.graph.plan_table` build one table's problem again with other charges
    only).

    An entry of an edge's matrix depends on the producer's strategy and the consumer's only
    through its signature: the collective plans (`formulas.collective_plan`, free of sizes) of
    its forward (the producer's output to the consumer's read) and backward (the gradient
    arriving to the one the producer needs), whether the read is the output itself, how the
    producer's gathered copy serves the read (`_reads_gathered`), and the two recompute
    flags and the producer's whole-gradient flag. The signatures of a matrix are computed
    with numpy over its distinct keys (`_Side`); each signature new to an edge's tensor
    size and flags is evaluated once, on a pair of strategies that has it, by
    `edge_seconds`.

    Mutable: it fills as problems are built, and holds every strategy tuple it has seen, so
    that their ids stay theirs and key it safely. Make one per planning call.
    """

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._ids: dict = {}  # placements -> id
        self._placements: list = []  # id -> placements
        self._atoms: dict = {}  # one axis's placement -> atom id
        self._dims: list[int] = []  # atom id -> its dim if a Shard, else -1
        self._plain = True  # every atom a Shard, Replicate or Partial (`_plan_keys`)
        self._axes = np.zeros((16, len(mesh.shape)), dtype=np.int64)  # id -> atom ids
        self._plan_ids: dict = {None: _NO_PLAN, (): _LOCAL_PLAN}
        self._plans = np.full((16, 16), -1, dtype=np.int64)  # [src id, dst id] -> plan id
        self._producers: dict[int, tuple] = {}
        self._consumers: dict[tuple[int, int], tuple] = {}
        self._values: dict[tuple, tuple] = {}
        self._tables: dict[tuple, tuple] = {}
        self._held: dict[tuple, tuple] = {}
        self._local: dict[tuple, float] = {}  # (placements id, nbytes) -> local bytes

    def seconds(self, ref: EdgeRef, src: tuple[Strategy, ...], dst: tuple[Strategy, ...],
                microbatches: int) -> EdgeSecondsTable:
        """The `edge_seconds` of edge `ref` for every pair of its producer's strategies `src`
        and its consumer's `dst`, in a step of `microbatches` runs of the graph."""
        nbytes = ref.tensor.nbytes
        context = (nbytes, ref.requires_grad, ref.saved, ref.same_block,
                   ref.producer_is_parameter, ref.consumer_is_view, ref.consumer_saves,
                   ref.bucket_bytes, microbatches)
        # Strategy tuples are shared between identical ops, so repeated blocks hit this.
        key = (id(src), id(dst), ref.position, context)
        found = self._tables.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        codes = self._signatures(ref, producers, consumers)
        unique, first, inverse = np.unique(codes.ravel(), return_index=True,
                                           return_inverse=True)
        values = np.empty((len(unique), 3))
        for row, (code, at) in enumerate(zip(unique.tolist(), first.tolist())):
            value = self._values.get((context, code))
            if value is None:
                k, m = divmod(at, codes.shape[1])
                value = edge_seconds(ref, src[producers.first[k]], dst[consumers.first[m]],
                                     nbytes, self.mesh, microbatches)
                value = self._values[(context, code)] = (
                    (math.inf, 0, 0) if value is None else value)  # not executable: forbidden
            values[row] = value
        index = inverse.reshape(codes.shape)[np.ix_(producers.of, consumers.of)]
        table = EdgeSecondsTable(values[:, 0], values[:, 1], values[:, 2],
                                 index.astype(np.int32))
        self._tables[key] = (src, dst, table)
        return table

    def held(self, ref: EdgeRef, src: tuple[Strategy, ...], dst: tuple[Strategy, ...], *,
             first_of_tie: bool) -> np.ndarray:
        """`held_bytes` of edge `ref`, copy plus own, for every pair of its producer's
        strategies `src` and its consumer's `dst` (a Ks x Kd array, shared: do not write
        it); the producer keeps its output unless recomputed outside the first block of a
        tie group (`first_of_tie`)."""
        nbytes = ref.tensor.nbytes
        key = (id(src), id(dst), ref.position, nbytes, ref.keeps, ref.owns, first_of_tie,
               ref.producer_off_path)
        found = self._held.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        values = np.zeros((len(producers.first), len(consumers.first)))
        if ref.keeps:
            out, _, _, src_recompute, _ = producers.keys.T
            read, _, dst_recompute = consumers.keys.T
            copy = out[:, None] != read[None, :]
            if ref.producer_off_path:
                copy &= ~self._sliced_views(out, read)
            values = np.where(copy, self._bytes(read, nbytes)[None, :], 0.0)
            if ref.owns:
                own = ((~copy | (dst_recompute == 1)[None, :])
                       & ((src_recompute == 0) | first_of_tie)[:, None])
                values += np.where(own, self._bytes(out, nbytes)[:, None], 0.0)
        matrix = values[np.ix_(producers.of, consumers.of)]
        self._held[key] = (src, dst, matrix)
        return matrix

    def owned_parts(self, ref: EdgeRef, src: tuple[Strategy, ...], dst: tuple[Strategy, ...],
                    *, first_of_tie: bool) -> tuple[np.ndarray, np.ndarray]:
        """For an edge that `owns` its producer's output, the parts of `held` that depend
        on one end alone: per consumer strategy, the local bytes of its read; per producer
        strategy, minus the local bytes of its output when it is recomputed (outside the
        first block of a tie group), where the consumer must read the output as it is
        and keeps a handle. Their sum is `held` except for a recomputed consumer that
        reads through a conversion (its recipe keeps the output too)."""
        nbytes = ref.tensor.nbytes
        key = (id(src), id(dst), ref.position, nbytes, "parts", first_of_tie)
        found = self._held.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        out, src_recompute = producers.keys.T[0], producers.keys.T[3]
        reads = self._bytes(consumers.keys.T[0], nbytes)[consumers.of]
        dropped = (src_recompute == 1) & (not first_of_tie)
        outputs = -np.where(dropped, self._bytes(out, nbytes), 0.0)[producers.of]
        self._held[key] = (src, dst, (reads, outputs))
        return reads, outputs

    def _bytes(self, ids: np.ndarray, nbytes) -> np.ndarray:
        """The local bytes of a tensor of `nbytes` at each of the placements `ids`."""
        values = []
        for i in ids.tolist():
            found = self._local.get((i, nbytes))
            if found is None:
                found = self._local[(i, nbytes)] = float(formulas.local_bytes(
                    nbytes, self._placements[i], self.mesh.shape))
            values.append(found)
        return np.array(values, dtype=float)

    def _id(self, placements) -> int:
        found = self._ids.get(placements)
        if found is not None:
            return found
        new = self._ids[placements] = len(self._placements)
        self._placements.append(placements)
        if new >= len(self._axes):
            self._axes = np.concatenate([self._axes, np.zeros_like(self._axes)])
            grown = np.full((2 * len(self._plans),) * 2, -1, dtype=np.int64)
            grown[:len(self._plans), :len(self._plans)] = self._plans
            self._plans = grown
        self._axes[new] = [self._atom(p) for p in placements]
        return new

    def _sliced_views(self, out: np.ndarray, read: np.ndarray) -> np.ndarray:
        """Per (output id, read id), whether they differ on one axis only, Replicate to
        Shard(0) (`sliced_view`)."""
        stored, reads = self._axes[out][:, None], self._axes[read][None]
        differ = stored != reads
        sliced = (stored == self._atom(Replicate())) & (reads == self._atom(Shard(0)))
        return (differ.sum(axis=2) == 1) & np.all(~differ | sliced, axis=2)

    def _atom(self, placement) -> int:
        found = self._atoms.get(placement)
        if found is None:
            found = self._atoms[placement] = len(self._dims)
            self._dims.append(placement.dim if type(placement) is Shard else -1)
            self._plain &= type(placement) in (Shard, Replicate, Partial)
        return found

    def _producers_of(self, strategies: tuple[Strategy, ...]) -> _Side:
        """Producer keys: output, gathered copy (-1: none), whole gradient, recompute, and
        the gradient placement the output needs (`formulas.needed_grad`)."""
        found = self._producers.get(id(strategies))
        if found is None:
            found = self._producers[id(strategies)] = (strategies, _side(
                [(self._id(s.output), -1 if s.gathered is None else self._id(s.gathered),
                  s.whole_gradient, s.recompute, self._id(formulas.needed_grad(s.output)))
                 for s in strategies]))
        return found[1]

    def _consumers_of(self, strategies: tuple[Strategy, ...], position: int) -> _Side:
        """Consumer keys at input `position`: the placement read, the gradient placement it
        hands back (`formulas.arriving_grad`), recompute."""
        found = self._consumers.get((id(strategies), position))
        if found is None:
            found = self._consumers[(id(strategies), position)] = (strategies, _side(
                [(self._id(s.inputs[position]),
                  self._id(formulas.arriving_grad(s.inputs[position], s.output)), s.recompute)
                 for s in strategies]))
        return found[1]

    def _signatures(self, ref: EdgeRef, producers: _Side, consumers: _Side) -> np.ndarray:
        """Per (producer key, consumer key), the signature the edge's seconds depend on
        (see the class docstring), packed in an int64."""
        out, gathered, whole, src_recompute, needed = producers.keys.T
        read, arriving, dst_recompute = consumers.keys.T
        forward = self._plan_matrix(out, read)
        backward = (self._plan_matrix(arriving, needed).T if ref.requires_grad
                    else np.zeros_like(forward))
        use = np.zeros_like(forward)  # 0: no gathered copy; 1: read from it; 2: can't be
        kept = np.flatnonzero(gathered >= 0)
        if kept.size:
            # `_reads_gathered`: every axis the copy is gathered on is read otherwise than
            # stored, and local steps alone reach the read from the copy.
            stored, copy, reads = (self._axes[out[kept]][:, None], self._axes[gathered[kept]]
                                   [:, None], self._axes[read][None])
            gathered_read = np.all((copy == stored) | (reads != stored), axis=2)
            local = self._plan_matrix(gathered[kept], read) == _LOCAL_PLAN
            use[kept] = np.where(gathered_read & local, 1, 2)
        flags = use * 2 + (out[:, None] == read[None])
        for column in (whole[:, None], src_recompute[:, None], dst_recompute[None]):
            flags = flags * 2 + column
        return (forward << (_FLAG_BITS + _PLAN_BITS)) | (backward << _FLAG_BITS) | flags

    def _plan_matrix(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """The ids of `formulas.collective_plan` from placements `rows[i]` to `columns[j]`; pairs
        new to the cache are planned once per key of `_plan_keys`."""
        rows, row_of = np.unique(rows, return_inverse=True)
        columns, column_of = np.unique(columns, return_inverse=True)
        plans = self._plans[np.ix_(rows, columns)]
        missing = np.nonzero(plans < 0)
        if missing[0].size:
            sources, targets = rows[missing[0]], columns[missing[1]]
            _, first, same = np.unique(self._plan_keys(sources, targets), axis=0,
                                       return_index=True, return_inverse=True)
            ids = np.array([self._plan_ids.setdefault(formulas.collective_plan(
                self._placements[sources[at]], self._placements[targets[at]], self.mesh.shape),
                len(self._plan_ids)) for at in first.tolist()], dtype=np.int64)
            plans[missing] = self._plans[sources, targets] = ids[same.ravel()]
            assert len(self._plan_ids) < 1 << _PLAN_BITS
        return plans[np.ix_(row_of.ravel(), column_of.ravel())]

    def _plan_keys(self, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Per pair of placements (ids), a row that determines its collective plan: the atoms
        of both, each Shard's dim renumbered as the first of the 2 x axes positions holding
        it. `conversion_steps`, `axis_collective` and the pieces only compare Shard dims for
        equality, so pairs that differ by a renumbering of dims share their plan (exact for
        Shard, Replicate and Partial; with another atom in the cache, the atoms alone)."""
        atoms = np.concatenate([self._axes[sources], self._axes[targets]], axis=1)
        if not self._plain:
            return atoms
        dims = np.array(self._dims, dtype=np.int64)[atoms]
        first = np.broadcast_to(np.arange(atoms.shape[1]), atoms.shape).copy()
        for j in range(atoms.shape[1]):
            for i in range(j - 1, -1, -1):  # descending: the earliest match is written last
                first[:, j] = np.where(dims[:, j] == dims[:, i], i, first[:, j])
        return np.where(dims >= 0, first, atoms.shape[1] + atoms)


class EdgeCaches:
    """An `EdgeCache` per mesh, made when first asked for: the caches of one planning call,
    whose problems (micro-batch counts, pipeline stages, restrictions) share most edges'
    collective plans, and the seconds of edges of equal sizes."""

    def __init__(self) -> None:
        self._by_mesh: dict[Mesh, EdgeCache] = {}

    def of(self, mesh: Mesh) -> EdgeCache:
        found = self._by_mesh.get(mesh)
        if found is None:
            found = self._by_mesh[mesh] = EdgeCache(mesh)
        return found


def _side(keys: list[tuple]) -> _Side:
    """The `_Side` of strategies with `keys` (tuples of ints and bools), groups numbered in
    order of first appearance."""
    groups: dict[tuple, int] = {}
    of = np.array([groups.setdefault(key, len(groups)) for key in keys], dtype=np.int64)
    _, first = np.unique(of, return_index=True)
    return _Side(np.array(list(groups), dtype=np.int64).reshape(len(groups), -1), first, of)
