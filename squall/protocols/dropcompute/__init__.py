"""DropCompute: synchronous all-reduce SGD whose workers drop the micro-batches left after a compute threshold."""
