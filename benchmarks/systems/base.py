"""The interface every benchmarked system implements, and shared helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from benchmarks.tokens import ChatFormula

__all__ = [
    "VIEW_LABELS",
    "Context",
    "DbTarget",
    "Msg",
    "SkipSystem",
    "System",
    "WindowSpec",
    "package_version",
]

Msg = dict[str, Any]
T = TypeVar("T")

VIEW_LABELS = {
    "token_limited": "TokenLimited",
    "score_based": "ScoreBased",
    "head_and_tail": "HeadAndTail",
}


class SkipSystem(Exception):
    """Raised by a system that cannot run here (missing package, store not landed)."""


@dataclass(frozen=True)
class DbTarget:
    """Where a job's data lives: a SQLite file or a PostgreSQL database."""

    kind: Literal["sqlite", "postgres"]
    sqlite_path: Path | None = None
    pg_host: str = "127.0.0.1"
    pg_port: int = 5432
    pg_user: str = "postgres"
    pg_dbname: str | None = None

    @property
    def libpq_dsn(self) -> str:
        """A psycopg connection string (PostgreSQL only)."""
        return (
            f"host={self.pg_host} port={self.pg_port} user={self.pg_user} dbname={self.pg_dbname}"
        )

    def url(self, *, asyncio_driver: bool = False) -> str:
        """A SQLAlchemy URL: ``sqlite[+aiosqlite]`` or ``postgresql+psycopg`` (sync or async)."""
        if self.kind == "sqlite":
            assert self.sqlite_path is not None
            scheme = "sqlite+aiosqlite" if asyncio_driver else "sqlite"
            return f"{scheme}:///{self.sqlite_path}"
        # psycopg 3's SQLAlchemy dialect serves both create_engine and create_async_engine.
        return f"postgresql+psycopg://{self.pg_user}@{self.pg_host}:{self.pg_port}/{self.pg_dbname}"


@dataclass(frozen=True)
class WindowSpec:
    """One kind of window: a view and a token budget.

    ``head_and_tail`` is count-based: it keeps ``head`` oldest and ``tail`` newest
    messages, derived from the budget (``head=4``, ``tail=budget // 100``, about the
    budget's worth of messages at this workload's ~90 tokens/message); its windows
    are not held to the budget.
    """

    view: str
    budget: int

    @property
    def budgeted(self) -> bool:
        """Whether the window must fit the budget."""
        return self.view != "head_and_tail"

    @property
    def head_tail(self) -> tuple[int, int]:
        """``(head_size, tail_size)`` for ``head_and_tail``."""
        return 4, max(1, self.budget // 100)

    @property
    def label(self) -> str:
        """Human label, e.g. ``TokenLimited 4k``."""
        name = VIEW_LABELS[self.view]
        if self.view == "head_and_tail":
            h, t = self.head_tail
            return f"{name}({h}+{t}) ~{self.budget // 1000}k"
        return f"{name} {self.budget // 1000}k"

    @property
    def key(self) -> str:
        """Stable id used in the results JSON."""
        return f"{self.view}:{self.budget}"


@dataclass
class Context:
    """What a system needs besides its database.

    Attributes:
        formula: the cl100k formula peers and the floor trim with.
        reference: the reference formula (memstore's counter when available).
        system_prompt: the workload's system prompt (for systems whose users keep
            it in application code rather than in the store).
        loop: the worker's event loop (async systems run everything on it).
        budgets: the run's token budgets.
    """

    formula: ChatFormula
    reference: ChatFormula
    system_prompt: Msg
    loop: asyncio.AbstractEventLoop
    budgets: tuple[int, ...] = (4_000, 32_000)


def package_version(*dists: str) -> str:
    """``name version`` of the installed distributions."""
    parts = []
    for d in dists:
        try:
            parts.append(f"{d} {metadata.version(d)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{d} (not installed)")
    return ", ".join(parts)


class System:
    """A benchmarked system bound to one database.

    Sync systems implement ``fetch``/``append``/``import_chunk``; async ones
    implement the ``a``-prefixed coroutines and set ``is_async``. ``fetch`` returns
    the system's native window (timed); ``to_openai`` turns it into chat dicts for
    the checks (not timed).
    """

    name: ClassVar[str] = "?"
    label: ClassVar[str] = "?"
    views: ClassVar[tuple[str, ...]] = ("token_limited",)
    is_async: ClassVar[bool] = False
    import_chunk_size: ClassVar[int] = 5_000
    #: how the system builds history (for the report)
    import_path: ClassVar[str] = ""
    #: how many times the main conversation is stored (LlamaIndex: once per budget)
    main_copies: int = 1
    #: measured in the agent-turn phase (append + 4k window); peers are not (their
    #: turn is their full load-and-trim, already in the window tables)
    measure_turns: ClassVar[bool] = False

    def __init__(self, db: DbTarget, ctx: Context) -> None:
        self.db = db
        self.ctx = ctx

    # ---- lifecycle ------------------------------------------------------------------

    @staticmethod
    def versions() -> str:
        """Versions of the packages this system measures."""
        return ""

    def setup(self) -> None:
        """Create tables (not timed)."""

    def close(self) -> None:
        """Release connections."""

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run a coroutine on the worker's loop."""
        return self.ctx.loop.run_until_complete(awaitable)

    # ---- writing --------------------------------------------------------------------

    def import_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        """Write ``chunk`` (the next messages of ``cid``) through the bulk path."""
        if self.is_async:
            self.run(self.aimport_chunk(cid, chunk, main=main))
            return
        raise NotImplementedError

    def finish_import(self, cid: str, *, main: bool) -> None:
        """Called once after the last chunk of ``cid``."""
        if self.is_async:
            self.run(self.afinish_import(cid, main=main))

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        """Async twin of :meth:`import_chunk`."""
        raise NotImplementedError

    async def afinish_import(self, cid: str, *, main: bool) -> None:
        """Async twin of :meth:`finish_import`."""

    def append(self, cid: str, message: Msg) -> None:
        """Append one message at the end of ``cid`` (tokenization included)."""
        raise NotImplementedError

    async def aappend(self, cid: str, message: Msg) -> None:
        """Async twin of :meth:`append`."""
        raise NotImplementedError

    # ---- reading --------------------------------------------------------------------

    def prepare(self, cid: str, spec: WindowSpec) -> Any:
        """Build whatever a fetch needs that a real caller builds once (not timed)."""
        return spec

    def fetch(self, cid: str, prepared: Any) -> Any:
        """Fetch one window (timed)."""
        raise NotImplementedError

    async def afetch(self, cid: str, prepared: Any) -> Any:
        """Async twin of :meth:`fetch`."""
        raise NotImplementedError

    def to_openai(self, native: Any) -> list[Msg]:
        """The window as OpenAI chat dicts (not timed)."""
        return list(native)

    # ---- helpers --------------------------------------------------------------------

    def call_fetch(self, cid: str, prepared: Any) -> Any:
        """Fetch one window, sync or async."""
        if self.is_async:
            return self.run(self.afetch(cid, prepared))
        return self.fetch(cid, prepared)

    def call_append(self, cid: str, message: Msg) -> None:
        """Append one message, sync or async."""
        if self.is_async:
            self.run(self.aappend(cid, message))
        else:
            self.append(cid, message)

    def timed_fetch(self, cid: str, prepared: Any, reps: int) -> list[float]:
        """Fetch ``reps`` windows; seconds per call (async timed inside the loop)."""
        if self.is_async:
            return self.run(_atimed(lambda: self.afetch(cid, prepared), reps))
        return _timed(lambda: self.fetch(cid, prepared), reps)

    def timed_appends(self, cid: str, messages: list[Msg]) -> list[float]:
        """Append each message; seconds per call."""
        if self.is_async:

            async def go() -> list[float]:
                out = []
                for m in messages:
                    t0 = _now()
                    await self.aappend(cid, m)
                    out.append(_now() - t0)
                return out

            return self.run(go())
        out = []
        for m in messages:
            t0 = _now()
            self.append(cid, m)
            out.append(_now() - t0)
        return out

    def timed_turns(self, cid: str, messages: list[Msg], prepared: Any) -> tuple[list[float], Any]:
        """One agent turn per message: append it, then fetch the window.

        Returns seconds per turn and the last window (native), for the check.
        """
        if self.is_async:

            async def go() -> tuple[list[float], Any]:
                out, native = [], None
                for m in messages:
                    t0 = _now()
                    await self.aappend(cid, m)
                    native = await self.afetch(cid, prepared)
                    out.append(_now() - t0)
                return out, native

            return self.run(go())
        out, native = [], None
        for m in messages:
            t0 = _now()
            self.append(cid, m)
            native = self.fetch(cid, prepared)
            out.append(_now() - t0)
        return out, native


def _now() -> float:
    import time

    return time.perf_counter()


def _timed(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = _now()
        fn()
        out.append(_now() - t0)
    return out


async def _atimed(fn: Callable[[], Awaitable[Any]], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = _now()
        await fn()
        out.append(_now() - t0)
    return out
