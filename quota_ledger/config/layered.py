"""A read-only mapping made of a large base and a small layer of changes on top.

Each configuration version set by :meth:`QuotaEngine.set_limits` differs from the previous one
in one queue. Copying a mapping of every queue for each version would cost as much as the whole
configuration; a :class:`Layered` mapping shares the base with the previous version and copies
only its layer, which is folded into a new base once it grows past the square root of the base
(so a change costs O(sqrt(n)) copies at worst, amortized, and O(1) lookups).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: a layer this small is always copied rather than folded
_SMALL_LAYER = 64


class Layered(Mapping[K, V]):
    """``base`` with ``layer``'s entries put over it; never changed once built."""

    __slots__ = ("_base", "_layer")

    def __init__(self, base: Mapping[K, V], layer: Mapping[K, V] | None = None) -> None:
        self._base = base
        self._layer: dict[K, V] = dict(layer or {})

    def __getitem__(self, key: K) -> V:
        layer = self._layer
        if key in layer:
            return layer[key]
        return self._base[key]

    def get(self, key: K, default: Any = None) -> Any:
        """``Mapping.get`` without raising and catching a KeyError: reservations ask often."""
        layer = self._layer
        if key in layer:
            return layer[key]
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._layer or key in self._base

    def __iter__(self) -> Iterator[K]:
        yield from self._base
        yield from (k for k in self._layer if k not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(1 for k in self._layer if k not in self._base)

    def __repr__(self) -> str:
        return f"Layered({dict(self)!r})"

    def updated(self, changes: Mapping[K, V]) -> Layered[K, V]:
        """A new mapping with ``changes`` over this one; this one is left as it is."""
        layer = {**self._layer, **changes}
        if len(layer) > max(_SMALL_LAYER, math.isqrt(len(self._base))):
            return Layered({**self._base, **layer})
        return Layered(self._base, layer)


def updated(mapping: Mapping[K, V], changes: Mapping[K, V]) -> Mapping[K, V]:
    """``mapping`` with ``changes`` over it, sharing what it can (see :class:`Layered`)."""
    if isinstance(mapping, Layered):
        return mapping.updated(changes)
    return Layered(mapping).updated(changes)
