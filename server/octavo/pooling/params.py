"""How one pooling request wants its prompt turned into a vector (vLLM's ``PoolingParams``).

Unset fields take the model's defaults (``PoolerConfig``: its sentence-transformers
config, else last-token pooling with normalisation); ``resolve`` fills them in once, on
the API side, so the engine and the workers only ever see complete settings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class PoolingType(enum.Enum):
    LAST = "LAST"  # the last prompt token's hidden state (decoder embedding models)
    MEAN = "MEAN"  # the average over every prompt token
    CLS = "CLS"  # the first token's

    @classmethod
    def parse(cls, value: str | PoolingType) -> PoolingType:
        if isinstance(value, PoolingType):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            names = ", ".join(kind.value for kind in cls)
            raise ValueError(f"pooling_type must be one of {names}, got {value!r}") from None

    @property
    def needs_every_token(self) -> bool:
        """Every prompt position must be computed (so no prefix-cache reuse)."""
        return self is not PoolingType.LAST


@dataclass(frozen=True)
class PoolingParams:
    """``dimensions``: keep the first N values (Matryoshka models only), then normalise."""

    pooling_type: PoolingType | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    # an encoder's segment per prompt token (BERT pairs: 0 for the first text, 1 for the
    # second); None: all 0
    token_type_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.token_type_ids is not None:
            object.__setattr__(self, "token_type_ids", tuple(self.token_type_ids))
        if self.pooling_type is not None:
            object.__setattr__(self, "pooling_type", PoolingType.parse(self.pooling_type))
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
        ):
            raise ValueError(f"dimensions must be an integer, got {self.dimensions!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}")

    @property
    def is_resolved(self) -> bool:
        return self.pooling_type is not None and self.normalize is not None

    def resolve(self, pooler: PoolerConfig) -> PoolingParams:
        """These settings with the model's defaults filled in; ValueError for a
        ``dimensions`` the model cannot give."""
        pooler.check_dimensions(self.dimensions)
        return replace(
            self,
            pooling_type=self.pooling_type or pooler.pooling_type,
            normalize=pooler.normalize if self.normalize is None else self.normalize,
        )


@dataclass(frozen=True)
class PoolerConfig:
    """A model's pooling defaults and the vector sizes it allows. ``hidden_size`` is the
    vector's: a classifier's is its label count (``classifies``: vectors are logits)."""

    pooling_type: PoolingType
    normalize: bool
    hidden_size: int
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: not a Matryoshka model
    is_matryoshka: bool = False  # any size up to hidden_size (``matryoshka_dimensions`` unset)
    classifies: bool = False  # a sequence classifier: vectors are its class logits
    labels: tuple[str, ...] = ()  # a classifier's class names (config.json's id2label)

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None or dimensions == self.hidden_size:
            return
        if not (self.is_matryoshka or self.matryoshka_dimensions):
            raise ValueError(
                "dimensions: this model does not support Matryoshka representation "
                "(its config.json has no is_matryoshka / matryoshka_dimensions)"
            )
        if dimensions > self.hidden_size:
            raise ValueError(
                f"dimensions must be at most the model's {self.hidden_size}, got {dimensions}"
            )
        allowed = self.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise ValueError(f"dimensions must be one of {list(allowed)}, got {dimensions}")
