"""User-facing entry points: the offline ``LLM`` class (and, later, the HTTP server)."""
