"""Strategy passes: the candidate shardings of every node, and the passes that add to them
(recompute, whole gradients) or restrict them (constraints, hand strategies)."""
