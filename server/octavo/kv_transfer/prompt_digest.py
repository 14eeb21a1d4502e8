"""A digest of what a prompt's KV blocks hold, the same on every engine.

A prefill engine stores it in the lease it grants, and a decode engine sends the digest
of its own prompt with every read: the prefill engine refuses a read whose digest
differs, so blocks computed for one prompt are never imported (and then published in
the decode engine's prefix cache) as another's, whatever the request's
``kv_transfer_params`` claim. It covers what the prefix cache's block hashes cover: the
prompt's token ids, the LoRA adapter's name, the request's ``cache_salt`` and the content
hashes of its images. Unlike those hashes it has no per-process seed, so two engines
agree on it.
"""

from __future__ import annotations

import hashlib
import json

from octavo.scheduler.sequence import Sequence


def prompt_digest(seq: Sequence) -> str:
    """The hex SHA-256 of ``seq``'s prompt tokens, adapter name, cache salt and images."""
    keys = seq.hash_chain.keys
    described = {
        "prompt_token_ids": seq.prompt_token_ids,
        "lora_name": keys.lora_name,
        "cache_salt": keys.cache_salt,
        "images": [list(span) for span in keys.image_spans],
    }
    encoded = json.dumps(described, separators=(",", ":"), sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()
