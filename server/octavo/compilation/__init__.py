"""What runs the model besides eager PyTorch: how vLLM spells it (``--compilation-config``
/ ``-O``, which also sizes the decode CUDA graphs of ``model_executor/decode_graphs``) and
torch.compile of the decoder layers."""
