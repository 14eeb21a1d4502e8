"""The paged KV cache: block pool with prefix caching, per-sequence block tables, tensors."""
