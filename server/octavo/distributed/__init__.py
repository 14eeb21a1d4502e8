"""Which shard of the model this process holds, and the collectives between shards."""
