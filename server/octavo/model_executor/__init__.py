"""Loading Llama-family weights and running the forward pass on the paged cache."""
