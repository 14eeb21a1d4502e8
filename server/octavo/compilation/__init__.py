"""What runs the model besides eager PyTorch: CUDA graphs of decode steps (and the
settings vLLM spells ``--compilation-config`` / ``-O``)."""
