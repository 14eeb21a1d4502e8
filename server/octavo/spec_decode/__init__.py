"""Speculative decoding: proposing several next tokens cheaply and verifying them exactly."""
