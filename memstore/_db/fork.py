"""What a forked child does to objects it inherited (one ``os.register_at_fork`` hook).

Objects register a function to run on them in a child after ``os.fork()``: an engine
drops its pool's connections (shared with the parent), a row cache renews its lock
(another thread may have held it at the fork). They are held weakly, so a store and
everything it made are collected as usual, and one process-wide hook serves them all
(a hook per store could never be removed: a process opening many stores would pile
them up).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

_AFTER_FORK: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def after_fork_in_child(target: Any, action: Callable[[Any], None]) -> None:
    """Run ``action(target)`` in a child process after ``os.fork()``, while ``target`` lives."""
    _AFTER_FORK[target] = action


def _run_after_fork() -> None:
    for target, action in list(_AFTER_FORK.items()):
        action(target)


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_run_after_fork)
