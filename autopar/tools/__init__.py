"""Tools built on the compiler: the training loop of model files, sharded checkpoints,
model files, op coverage and the predicted memory of a plan."""
