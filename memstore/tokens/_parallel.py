"""Counting one large batch of messages on several threads.

tiktoken's encoder is Rust code that releases the GIL while it encodes, so a batch
whose text takes milliseconds to encode (an ``extend`` of a hundred messages, an
import) finishes sooner when its halves are encoded at once. The Python around each
encode still holds the GIL: two threads cut the time by about a third, not a half.

The pool is shared by the process and made on first use. Work is handed to it only
when the batch is large enough to pay for the hand-off (`PARALLEL_MIN_CHARS`).
A chunk whose task has not started by the time the calling thread has counted its own
chunk (the pool is busy with other callers) is taken back and counted on the calling
thread, so a caller never queues behind other callers' batches. It does wait for a
chunk the pool has started. When every core is already busy, splitting gains nothing
and costs a few percent (two callers on two cores, each counting batches of 100
messages: about 6–10% slower than one thread each); ``TiktokenCounter(threads=1)``
turns it off.

A process forked after the pool was made does not inherit its threads: the pool (and
its lock) are made again in the child.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PARALLEL_MIN_CHARS", "MAX_THREADS", "available_cpus", "map_chunks", "split_by_size"]

#: Characters of text a batch must hold (at least) to be split across threads: about
#: 0.5 ms of encoding. Below it, handing work to a thread costs more than it saves
#: (measured on cl100k: 8,000 characters are a wash, 15,000 save a third).
PARALLEL_MIN_CHARS = 16_000

#: The most threads one batch is split across (the calling thread included).
MAX_THREADS = 4

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_workers = 0


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota.

    A container limited to, say, 1.5 CPUs (cgroup v2 ``cpu.max``, or v1
    ``cpu.cfs_quota_us``) counts as 2, whatever the host's core count.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, quota)) if quota is not None else max(1, cpus)


def _cgroup_quota() -> int | None:
    """The cgroup CPU quota, rounded up to whole CPUs (``None``: no quota, or no cgroup)."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:  # cgroup v2
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:  # cgroup v1
            with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
                quota = f.read().strip()
            with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
                period = f.read().strip()
        except OSError:
            return None
    return _quota_cpus(quota, period)


def _quota_cpus(quota: str, period: str) -> int | None:
    """Whole CPUs of a quota and period as cgroup files write them (``max`` or -1: none)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None  # "max": no quota
    if q <= 0 or p <= 0:
        return None
    return -(-q // p)


def _reset_after_fork() -> None:
    """In a forked child: a new lock (the parent's may have been held) and no pool."""
    global _lock, _pool, _pool_pid, _pool_workers
    _lock = threading.Lock()
    _pool, _pool_pid, _pool_workers = None, 0, 0


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_reset_after_fork)


def _executor(workers: int) -> ThreadPoolExecutor:
    """The process's counting pool, with at least ``workers`` threads."""
    global _pool, _pool_pid, _pool_workers
    pid = os.getpid()
    with _lock:
        if _pool is None or _pool_pid != pid or _pool_workers < workers:
            old = _pool if _pool_pid == pid else None
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memstore-count")
            _pool_pid, _pool_workers = pid, workers
            if old is not None:
                old.shutdown(wait=False)  # its idle threads exit; running tasks finish
        return _pool


def split_by_size(
    items: Sequence[T], parts: int, size: Callable[[T], int], min_total: int
) -> list[Sequence[T]]:
    """``items`` cut into at most ``parts`` contiguous chunks of about equal ``size``.

    One chunk (the whole sequence) when ``parts`` is below 2, there are fewer than two
    items, or their total size is below ``min_total``.
    """
    if parts < 2 or len(items) < 2:
        return [items]
    sizes = [size(item) for item in items]
    total = sum(sizes)
    if total < min_total:
        return [items]
    parts = min(parts, len(items))
    chunks: list[Sequence[T]] = []
    start = 0
    acc = 0
    for i, n in enumerate(sizes):
        acc += n
        # Close a chunk once it holds its share, leaving an item for each chunk to come.
        if (acc * parts >= total * (len(chunks) + 1) and len(chunks) < parts - 1
                and len(items) - (i + 1) >= parts - 1 - len(chunks)):
            chunks.append(items[start:i + 1])
            start = i + 1
    chunks.append(items[start:])
    return chunks


def map_chunks(fn: Callable[[Sequence[T]], list[R]], chunks: list[Sequence[T]]) -> list[R]:
    """``fn`` over each chunk, concatenated in order; chunks after the first on the pool.

    The calling thread counts the first chunk meanwhile. A pooled chunk that has not
    started when the caller reaches it is cancelled and run on the caller. An exception
    from any chunk propagates (the first one raised, in chunk order).
    """
    if len(chunks) == 1:
        return fn(chunks[0])
    futures: list[Future[list[R]] | None] = []
    try:
        pool = _executor(len(chunks) - 1)
        for chunk in chunks[1:]:
            futures.append(pool.submit(fn, chunk))
    except RuntimeError:
        # The pool cannot take work: the interpreter is shutting down, or another caller
        # just replaced it with a larger one (it is shut down). Count those chunks here.
        futures.extend([None] * (len(chunks) - 1 - len(futures)))
    try:
        out = fn(chunks[0])
        for future, chunk in zip(futures, chunks[1:]):
            if future is None or future.cancel():
                out.extend(fn(chunk))
            else:
                out.extend(future.result())
        return out
    finally:
        for future in futures:
            if future is not None:
                future.cancel()  # (a no-op for those done or running)
