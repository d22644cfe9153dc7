"""`EdgeCache`: the `edge_costs` of one edge for every pair of its ends' strategies, as
matrices, computed once per distinct signature and kept from one problem to the next.

An edge's seconds (`edge_seconds`) for a pair of strategies depend on the pair only
through its signature (`EdgeCache`'s docstring); the cache evaluates each signature new to
an edge's tensor size and flags once and keeps it across the overlap rounds of
`autopar.planning.graph.plan_table`, which change only the charges
(`EdgeSecondsTable.charged`). `EdgeCache.held` computes an edge's `held_bytes` matrix once
per distinct pair of (output, recompute) and (read, recompute) keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.costs import formulas, staging, uneven
from autopar.passes.problem.edge_costs import Background, EdgeRef, edge_seconds
from autopar.passes.strategies.find_strategies import Strategy
from autopar.values.compression import compression_named
from autopar.values.mesh import Mesh
from autopar.values.placement import Partial, Replicate, Shard


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
# above _FLAG_BITS, each in _PLAN_BITS bits, and below them five flags (the gathered copy's
# use in two bits) and the parameter's compression in _COMPRESSION_BITS (its id in the
# cache, 0 for none).
_FLAG_BITS, _PLAN_BITS, _COMPRESSION_BITS = 12, 24, 6
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
        self._compressions: dict[str, int] = {}  # compression name -> id
        self._consumers: dict[tuple[int, int], tuple] = {}
        self._values: dict[tuple, tuple] = {}
        self._tables: dict[tuple, tuple] = {}
        self._held: dict[tuple, tuple] = {}
        self._local: dict[tuple, float] = {}  # (placements id, nbytes) -> local bytes
        self._staged: dict[tuple, float] = {}  # (src id, dst id) -> staging bytes per byte

    def seconds(self, ref: EdgeRef, src: tuple[Strategy, ...], dst: tuple[Strategy, ...],
                microbatches: int) -> EdgeSecondsTable:
        """The `edge_seconds` of edge `ref` for every pair of its producer's strategies `src`
        and its consumer's `dst`, in a step of `microbatches` runs of the graph."""
        nbytes = uneven.cost_bytes(ref.tensor, self.mesh)
        context = (nbytes, ref.requires_grad, ref.saved, ref.same_block,
                   ref.producer_is_parameter, ref.consumer_is_view, ref.consumer_saves,
                   ref.bucket_bytes, ref.producer_recomputed, ref.consumer_writes,
                   microbatches,
                   # A compressed parameter's bytes follow its shape (PowerSGD's matrix).
                   ref.tensor.shape if ref.producer_is_parameter else None)
        # Strategy tuples are shared between identical ops, so repeated blocks hit this.
        key = (id(src), id(dst), ref.position, context)
        found = self._tables.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        codes = self._signatures(ref, producers, consumers)
        if isinstance(nbytes, uneven.TensorBytes):
            # Uneven pieces differ from dim to dim, which signatures do not tell apart:
            # every pair of groups is its own, valid for these strategies only.
            codes = np.arange(codes.size, dtype=np.int64).reshape(codes.shape)
            context = (*context, id(src), id(dst), ref.position)
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

    def held(self, ref: EdgeRef, src: tuple[Strategy, ...],
             dst: tuple[Strategy, ...]) -> np.ndarray:
        """`held_bytes` of edge `ref`, copy plus own, for every pair of its producer's
        strategies `src` and its consumer's `dst` (a Ks x Kd array, shared: do not write
        it); the producer keeps its output unless recomputed."""
        nbytes = uneven.cost_bytes(ref.tensor, self.mesh)
        key = (id(src), id(dst), ref.position, nbytes, ref.keeps, ref.owns,
               ref.producer_off_path, ref.recipe)
        found = self._held.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        values = np.zeros((len(producers.first), len(consumers.first)))
        if ref.keeps:
            out, _, _, src_recompute, _, _ = producers.keys.T
            read, _, dst_recompute = consumers.keys.T
            copy = out[:, None] != read[None, :]
            if ref.producer_off_path:
                copy &= ~self._sliced_views(out, read)
            values = np.where(copy, self._bytes(read, nbytes)[None, :], 0.0)
            if ref.owns:
                own = ((~copy | (dst_recompute == 1)[None, :])
                       & (src_recompute == 0)[:, None])
                values += np.where(own, self._bytes(out, nbytes)[:, None], 0.0)
        elif ref.recipe:
            out, src_recompute = producers.keys.T[0], producers.keys.T[3]
            dst_recompute = consumers.keys.T[2]
            recipe = (src_recompute == 0)[:, None] & (dst_recompute == 1)[None, :]
            values = np.where(recipe, self._bytes(out, nbytes)[:, None], 0.0)
        matrix = values[np.ix_(producers.of, consumers.of)]
        self._held[key] = (src, dst, matrix)
        return matrix

    def owned_parts(self, ref: EdgeRef, src: tuple[Strategy, ...],
                    dst: tuple[Strategy, ...]) -> tuple[np.ndarray, np.ndarray]:
        """For an edge that `owns` its producer's output, the parts of `held` that depend
        on one end alone: per consumer strategy, the local bytes of its read; per producer
        strategy, minus the local bytes of its output when it is recomputed, where the
        consumer must read the output as it is
        and keeps a handle. Their sum is `held` except for a recomputed consumer that
        reads through a conversion (its recipe keeps the output too)."""
        nbytes = uneven.cost_bytes(ref.tensor, self.mesh)
        key = (id(src), id(dst), ref.position, nbytes, "parts")
        found = self._held.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        out, src_recompute = producers.keys.T[0], producers.keys.T[3]
        reads = self._bytes(consumers.keys.T[0], nbytes)[consumers.of]
        dropped = src_recompute == 1
        outputs = -np.where(dropped, self._bytes(out, nbytes), 0.0)[producers.of]
        self._held[key] = (src, dst, (reads, outputs))
        return reads, outputs

    def transients(self, ref: EdgeRef, src: tuple[Strategy, ...], dst: tuple[Strategy, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """What edge `ref`'s conversions make and nothing keeps, for every pair of
        strategies (Ks x Kd arrays, shared: do not write them): in the forward, at its
        consumer's step, the converted tensor a consumer that does not keep it reads (a
        parameter's, unless kept gathered); in the backward, at its consumer's backward,
        the gradient converted to the placement its producer needs, and a parameter's
        copy gathered again for the backward (not kept gathered: ZeRO-3); each conversion
        with its staging buffers (`autopar.costs.staging`), a kept one's too; an int8
        gather's received int8 values besides (`compression.quantized_bytes`, less the
        scales)."""
        nbytes = uneven.cost_bytes(ref.tensor, self.mesh)
        key = (id(src), id(dst), ref.position, nbytes, "transients", ref.keeps,
               ref.requires_grad, ref.producer_is_parameter, ref.producer_off_path)
        found = self._held.get(key)
        if found is not None:
            return found[2]
        producers, consumers = self._producers_of(src), self._consumers_of(dst, ref.position)
        out, gathered, _, _, needed, compression = producers.keys.T
        read, arriving, _ = consumers.keys.T
        copy = out[:, None] != read[None, :]
        if ref.producer_off_path:
            copy &= ~self._sliced_views(out, read)
        if ref.producer_is_parameter:
            copy &= (gathered < 0)[:, None]
        reads = np.where(copy, self._bytes(read, nbytes)[None, :], 0.0)
        staged = np.where(copy, self._staging(out, read, nbytes), 0.0)
        if ref.producer_is_parameter:
            staged = staged + np.where(self._quantized(compression)[:, None], reads, 0.0) \
                / ref.tensor.itemsize
        forward = staged if ref.keeps else reads + staged
        backward = reads + staged if ref.producer_is_parameter else np.zeros_like(reads)
        if ref.requires_grad:
            converted = needed[:, None] != arriving[None, :]
            backward = backward + np.where(
                converted, self._bytes(needed, nbytes)[:, None]
                + self._staging(arriving, needed, nbytes).T, 0.0)
        rows, columns = np.ix_(producers.of, consumers.of)
        matrices = (forward[rows, columns], backward[rows, columns])
        self._held[key] = (src, dst, matrices)
        return matrices

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

    def _staging(self, src: np.ndarray, dst: np.ndarray, nbytes) -> np.ndarray:
        """Per (src id, dst id), the `staging_bytes` of converting a tensor of `nbytes`
        between the two placements: `nbytes` times that of one byte (every term is a local
        size, the tensor's bytes over its pieces), each distinct pair computed once."""
        sources, src_at = np.unique(src, return_inverse=True)
        targets, dst_at = np.unique(dst, return_inverse=True)
        # Uneven pieces are not a tensor's bytes over its pieces: sized per tensor.
        size = nbytes if isinstance(nbytes, uneven.TensorBytes) else 1.0
        per_byte = np.empty((len(sources), len(targets)))
        for row, i in enumerate(sources.tolist()):
            for column, j in enumerate(targets.tolist()):
                found = self._staged.get((i, j, size))
                if found is None:
                    found = self._staged[(i, j, size)] = staging.staging_bytes(
                        size, self._placements[i], self._placements[j], self.mesh.shape)
                per_byte[row, column] = found
        scale = 1.0 if isinstance(nbytes, uneven.TensorBytes) else nbytes
        return scale * per_byte[np.ix_(src_at.ravel(), dst_at.ravel())]

    def _quantized(self, ids: np.ndarray) -> np.ndarray:
        """Per compression id, whether it gathers in int8."""
        kinds = {i: compression_named(name).kinds for name, i in self._compressions.items()}
        return np.array(["gather" in kinds.get(i, ()) for i in ids.tolist()], dtype=bool)

    def _compression_id(self, name: str | None) -> int:
        """The id of compression `name` in this cache, 0 for none."""
        if name is None:
            return 0
        found = self._compressions.setdefault(name, len(self._compressions) + 1)
        assert found < 1 << _COMPRESSION_BITS
        return found

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
        """Producer keys: output, gathered copy (-1: none), whole gradient, recompute, the
        gradient placement the output needs (`formulas.needed_grad`), and the gradient's
        compression (`_compression_id`)."""
        found = self._producers.get(id(strategies))
        if found is None:
            found = self._producers[id(strategies)] = (strategies, _side(
                [(self._id(s.output), -1 if s.gathered is None else self._id(s.gathered),
                  s.whole_gradient, s.recompute, self._id(formulas.needed_grad(s.output)),
                  self._compression_id(s.compression)) for s in strategies]))
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
        out, gathered, whole, src_recompute, needed, compression = producers.keys.T
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
        flags = (flags << _COMPRESSION_BITS) + compression[:, None]
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
