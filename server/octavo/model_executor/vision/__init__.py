"""Vision towers: the image encoders of vision-language models, as blocks."""
