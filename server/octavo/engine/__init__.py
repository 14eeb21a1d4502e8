"""The engine loop: requests in, scheduled steps through the model, outputs out."""
