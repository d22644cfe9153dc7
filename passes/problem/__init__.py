"""Problem passes: the strategy table as a `ShardingProblem` of seconds and bytes, folded
by depth, and the solver's choices read back into a `Plan`."""
