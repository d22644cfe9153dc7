"""Planning: the entry point `plan`, the layout of a step (micro-batches, a pipeline),
one graph's plan (passes, then the solver) and the hand strategies planned beside it."""
