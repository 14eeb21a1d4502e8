"""Pooling: one vector per prompt from the model's final hidden states (embeddings)."""
