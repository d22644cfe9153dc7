"""The cost model: pure formulas from sizes, placements and hardware to seconds and bytes
(compute, collectives, the context-parallel ring, pipeline schedules, optimizer state)."""
