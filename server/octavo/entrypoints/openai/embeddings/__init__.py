"""POST /v1/embeddings: one pooling request per input, answered together."""
