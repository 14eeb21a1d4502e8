"""Prefill/decode disaggregation: moving a prompt's KV blocks between two engines.

A prefill engine (P) keeps a finished prompt's blocks under a lease (``leases``) and
serves them over a TCP side channel (``side_channel``, framed by ``wire``); a decode
engine (D) reads them and writes them into its own cache (``block_io``). The control
plane (which requests transfer, when blocks are freed) lives beside these modules.
"""
