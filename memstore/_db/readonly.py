"""Read-only containers for the nested values of messages read from a store.

A store's row cache hands the same [`StoredMessage`][memstore.StoredMessage] objects to
every window that reads them. The models are frozen, but a frozen pydantic model
still holds plain ``dict`` and ``list`` values: a caller changing a window message's
``metadata`` (or appending to its ``content`` parts) would change what every later
window of that conversation returns, which the database does not hold. So the
decoder builds those values as `ReadOnlyDict` and `ReadOnlyList`:

* they are ``dict`` and ``list`` subclasses, so reading, ``isinstance``, equality,
  ``json.dumps`` and pydantic serialisation work as before;
* every change raises `ReadOnlyError` (a ``TypeError``);
* ``copy.copy``, ``copy.deepcopy`` (hence ``model_copy(deep=True)``), ``dict(x)`` and
  ``list(x)`` give plain, changeable containers.

Freezing costs nothing for the common row: empty metadata is one shared empty
`ReadOnlyDict`.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

from memstore.errors import ReadOnlyError

__all__ = ["EMPTY", "ReadOnlyDict", "ReadOnlyList", "freeze"]


def _refuse(kind: str) -> NoReturn:
    raise ReadOnlyError(
        f"this {kind} belongs to a message read from a store and is read-only (windows "
        "share those messages); change a copy: dict(...)/list(...) of it, or "
        "message.model_copy(deep=True)"
    )


class ReadOnlyDict(dict[str, Any]):
    """A ``dict`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __setitem__(self, *args: Any) -> NoReturn:
        _refuse("dict")

    def __delitem__(self, *args: Any) -> NoReturn:
        _refuse("dict")

    def __ior__(self, *args: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("dict")

    def clear(self) -> NoReturn:
        _refuse("dict")

    def pop(self, *args: Any) -> NoReturn:
        _refuse("dict")

    def popitem(self) -> NoReturn:
        _refuse("dict")

    def setdefault(self, *args: Any) -> NoReturn:
        _refuse("dict")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("dict")

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyDict, (dict(self),))


class ReadOnlyList(list[Any]):
    """A ``list`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __setitem__(self, *args: Any) -> NoReturn:
        _refuse("list")

    def __delitem__(self, *args: Any) -> NoReturn:
        _refuse("list")

    def __iadd__(self, *args: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("list")

    def __imul__(self, *args: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("list")

    def append(self, *args: Any) -> NoReturn:
        _refuse("list")

    def extend(self, *args: Any) -> NoReturn:
        _refuse("list")

    def insert(self, *args: Any) -> NoReturn:
        _refuse("list")

    def pop(self, *args: Any) -> NoReturn:
        _refuse("list")

    def remove(self, *args: Any) -> NoReturn:
        _refuse("list")

    def clear(self) -> NoReturn:
        _refuse("list")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("list")

    def reverse(self) -> NoReturn:
        _refuse("list")

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyList, (list(self),))


#: The metadata of most messages: one shared, empty, read-only dict.
EMPTY = ReadOnlyDict()


def freeze(value: Any) -> Any:
    """``value`` (decoded JSON) with every dict and list in it made read-only.

    Strings, numbers, booleans and ``None`` are immutable already; any other object
    (a frozen model, say) is returned as it is. An empty dict becomes `EMPTY`.
    """
    kind = type(value)
    if kind is dict:
        if not value:
            return EMPTY
        frozen: Any = ReadOnlyDict(value)  # one C-level copy; then only nested containers
        for key, item in value.items():
            if type(item) is dict or type(item) is list:
                dict.__setitem__(frozen, key, freeze(item))
        return frozen
    if kind is list:
        frozen = ReadOnlyList(value)
        for index, item in enumerate(value):
            if type(item) is dict or type(item) is list:
                list.__setitem__(frozen, index, freeze(item))
        return frozen
    return value  # (a ReadOnlyDict or ReadOnlyList is made by this function: frozen through)
