"""A read-only mapping made of a large base and a small layer of changes on top.

Each configuration version set by :meth:`QuotaEngine.set_limits` differs from the previous one
in one queue. Copying a mapping of every queue for each version would cost as much as the whole
configuration; a :class:`Layered` mapping shares the base with the previous version and copies
only its layer, which is folded into a new base once it grows past the square root of the base
(so a change costs O(sqrt(n)) copies at worst, amortized, and O(1) lookups).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

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


class Appended(Sequence[V]):
    """A tuple made of a large base and a short tail, so that appending one item copies only
    the tail (folded into a new base once it grows past the square root of the base, as
    :class:`Layered` folds its layer): a parent queue gains its 100,000th child in O(sqrt(n))
    copies at worst, amortized. Never changed once built; equal to a tuple of the same items."""

    __slots__ = ("_base", "_tail")

    def __init__(self, base: Iterable[V] = (), tail: tuple[V, ...] = ()) -> None:
        self._base = tuple(base)
        self._tail = tail

    @overload
    def __getitem__(self, index: int) -> V: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[V, ...]: ...
    def __getitem__(self, index: int | slice) -> V | tuple[V, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if 0 <= index < len(self._base):
            return self._base[index]
        return (self._base + self._tail)[index]

    def __iter__(self) -> Iterator[V]:
        yield from self._base
        yield from self._tail

    def __len__(self) -> int:
        return len(self._base) + len(self._tail)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Appended({tuple(self)!r})"

    def appended(self, value: V) -> Appended[V]:
        """A new sequence with ``value`` at the end; this one is left as it is."""
        tail = (*self._tail, value)
        if len(tail) > max(_SMALL_LAYER, math.isqrt(len(self._base))):
            return Appended(self._base + tail)
        return Appended(self._base, tail)


def appended(items: Sequence[V], value: V) -> Sequence[V]:
    """``items`` with ``value`` at the end, sharing what it can (see :class:`Appended`)."""
    if isinstance(items, Appended):
        return items.appended(value)
    return Appended(items).appended(value)
