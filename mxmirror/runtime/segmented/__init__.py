"""The segmented executor: a segment plan run as MXNet executors on one memory pool."""
