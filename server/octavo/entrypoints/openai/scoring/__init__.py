"""The scoring routes: /score, /rerank, /classify and /pooling (vLLM's names and shapes)."""
