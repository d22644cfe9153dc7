"""Pipeline planning: stage cuts, micro-batches and schedule around the intra-op planner,
and the Megatron 3D hand strategy."""
