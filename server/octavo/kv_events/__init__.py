"""KV cache events in vLLM's format (``--kv-events-config``), for KV-aware routers."""
