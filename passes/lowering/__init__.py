"""Lowering: the captured graph and its `Plan` as one rank's program over local shards."""
