"""Ways to cut a streamed reply into pieces, for tests that feed a parser piece by piece."""

from __future__ import annotations

import random


def chunkings(text: str) -> list[list[str]]:
    """One character at a time, cut once at every boundary, and random chunkings."""
    splits = [list(text)]
    splits += [[text[:cut], text[cut:]] for cut in range(1, len(text))]
    rng = random.Random(len(text))
    for _ in range(8):
        cuts = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1)))
        splits.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return splits
