"""The runtime: the Plan users bind, MXNet's own binds, BatchNorm ordering, the segmented
executor."""
