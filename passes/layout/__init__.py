"""Layout passes: a step cut into micro-batches, a graph cut into pipeline stages."""
