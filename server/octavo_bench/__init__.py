"""Octavo's benchmarks, outside the serving package: ``python -m octavo_bench offline|serve``.

Needs the ``bench`` extra (``pip install 'octavo[bench]'``: the server's dependencies and
matplotlib). ``offline`` runs Octavo against HF transformers in this process and vLLM's
CPU build from its own venv (``make vllm-venv``); ``serve`` measures any OpenAI-compatible
server, optionally against the naive HF server of ``serve_hf_server`` and vLLM's server.
"""
