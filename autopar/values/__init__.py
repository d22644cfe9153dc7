"""Value types every stage shares: the mesh and its hardware profiles, placements, the
specs a captured graph carries, a pipeline request and the `Plan`. They import nothing of
autopar but its errors."""
