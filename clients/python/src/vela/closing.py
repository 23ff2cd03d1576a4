"""The context-manager half the package's clients share: ``with X(...) as x:`` closes ``x`` on exit."""

from __future__ import annotations

from typing import Any, TypeVar

_T = TypeVar("_T", bound="Closing")


class Closing:
    """A base for classes with a ``close()``: ``__enter__`` returns the object, ``__exit__`` calls
    ``close()`` (also when the block raised; the exception then goes on)."""

    def close(self) -> Any:  # pragma: no cover - each client defines its own
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
