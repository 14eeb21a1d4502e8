"""Structured output: decoding constrained by a JSON schema, a regex, a choice or a grammar."""
