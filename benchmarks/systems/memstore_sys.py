"""memstore, sync (``MemoryStore``) and async (``AsyncMemoryStore``).

Written against the public API in DESIGN.md: ``MemoryStore(url, counter=...)``,
``store.extend``, ``store.append``, ``store.window(cid, view)`` with
``TokenLimitedView``, ``ScoreBasedView`` and ``HeadAndTailView``. Until the store
and views are importable, :meth:`setup` raises :class:`SkipSystem` and the run
reports memstore as skipped with the reason.

Both variants share one database per job: the sync store builds the history with
``extend`` (5,000 messages per call, each call one transaction); then each variant's
windows and appends are measured on it. Both use memstore's
``TiktokenCounter("cl100k_base")``, the run's reference counter.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, ClassVar

from benchmarks.systems.base import Msg, SkipSystem, System, WindowSpec, package_version

__all__ = ["MemstoreAsync", "MemstoreNoCache", "MemstoreSync"]

_NEEDED = (
    "AsyncMemoryStore",
    "HeadAndTailView",
    "MemoryStore",
    "Message",
    "ScoreBasedView",
    "TokenLimitedView",
)


def _api() -> SimpleNamespace:
    """memstore's public names, or :class:`SkipSystem` saying what is missing."""
    try:
        import memstore
    except ImportError as exc:
        raise SkipSystem(f"memstore is not importable: {exc}") from exc
    missing = [n for n in _NEEDED if not hasattr(memstore, n)]
    if missing:
        raise SkipSystem(f"memstore does not export {', '.join(missing)}")
    return SimpleNamespace(**{n: getattr(memstore, n) for n in _NEEDED})


def _view(ms: Any, spec: WindowSpec) -> Any:
    if spec.view == "token_limited":
        return ms.TokenLimitedView(spec.budget)
    if spec.view == "score_based":
        return ms.ScoreBasedView(spec.budget)
    head, tail = spec.head_tail
    return ms.HeadAndTailView(head, tail)


def _make_store(cls: Any, url: str, counter: Any, **options: Any) -> Any:
    """``cls(url, counter=counter, migrate="upgrade")``: each job's database is new."""
    try:
        return cls(url, counter=counter, migrate="upgrade", **options)
    except TypeError:  # an older signature without ``migrate``
        return cls(url, counter=counter)


class _MemstoreBase(System):
    measure_turns: ClassVar[bool] = True
    ms: SimpleNamespace
    views: ClassVar[tuple[str, ...]] = ("token_limited", "score_based", "head_and_tail")
    import_chunk_size: ClassVar[int] = 5_000
    import_path: ClassVar[str] = "MemoryStore.extend (one transaction per 5,000 messages)"

    @staticmethod
    def versions() -> str:
        return package_version("memstore", "sqlalchemy")

    def _counter(self) -> Any:
        counter = getattr(self.ctx.reference, "counter", None)
        if counter is None:
            raise SkipSystem("memstore.tokens.TiktokenCounter has not landed yet")
        return counter

    def prepare(self, cid: str, spec: Any) -> Any:
        return _view(self.ms, spec)

    def to_openai(self, native: Any) -> list[Msg]:
        return list(native.to_openai())


class MemstoreSync(_MemstoreBase):
    """``MemoryStore`` (sync)."""

    name: ClassVar[str] = "memstore"
    label: ClassVar[str] = "memstore (sync)"

    def setup(self) -> None:
        self.ms = _api()
        self.store = _make_store(self.ms.MemoryStore, self.db.url(), self._counter())

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def import_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        message = self.ms.Message.from_openai
        self.store.extend(cid, [message(m) for m in chunk])

    def fetch(self, cid: str, prepared: Any) -> Any:
        return self.store.window(cid, prepared)

    def append(self, cid: str, message: Msg) -> None:
        self.store.append(cid, self.ms.Message.from_openai(message))


class MemstoreAsync(_MemstoreBase):
    """``AsyncMemoryStore`` (aiosqlite / psycopg async), timed inside its event loop."""

    name: ClassVar[str] = "memstore-async"
    label: ClassVar[str] = "memstore (async)"
    is_async: ClassVar[bool] = True

    def setup(self) -> None:
        self.ms = _api()
        self.store = _make_store(
            self.ms.AsyncMemoryStore, self.db.url(asyncio_driver=True), self._counter()
        )

    def close(self) -> None:
        for name in ("aclose", "close", "dispose"):
            fn = getattr(self.store, name, None)
            if fn is not None:
                result = fn()
                if inspect.isawaitable(result):
                    self.run(result)
                return

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        message = self.ms.Message.from_openai
        await self.store.extend(cid, [message(m) for m in chunk])

    async def afetch(self, cid: str, prepared: Any) -> Any:
        return await self.store.window(cid, prepared)

    async def aappend(self, cid: str, message: Msg) -> None:
        await self.store.append(cid, self.ms.Message.from_openai(message))


class MemstoreNoCache(MemstoreSync):
    """``MemoryStore(cache_size=0)``: every window reads and decodes all its rows.

    The default store keeps the rows its windows decoded (validated by the
    conversation's epoch on every read), so repeated windows mostly come from memory;
    this variant shows what a window costs without that cache.
    """

    name: ClassVar[str] = "memstore-nocache"
    label: ClassVar[str] = "memstore (sync, cache_size=0)"

    def setup(self) -> None:
        self.ms = _api()
        self.store = _make_store(self.ms.MemoryStore, self.db.url(), self._counter(), cache_size=0)
