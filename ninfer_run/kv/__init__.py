"""KV memory: the paged block pool (the only KV memory) and its INT8 group-64 encoding."""
