"""Images in, text out: decoding images, the model's HF processor, placeholder ranges."""
