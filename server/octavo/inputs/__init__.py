"""Turning prompts into token ids, the same way for the offline ``LLM`` and the server."""
