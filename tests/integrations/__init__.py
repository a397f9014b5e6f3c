"""Tests of the framework integrations and provider formats.

Each module needs its framework installed (the ``test`` extra installs them all).
Without it the module is skipped with the reason, except when ``CI=true``: then the
missing package fails the run, like an unreachable PostgreSQL does.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType

import pytest

from memstore import ScoreBasedView, SummaryView, TokenLimitedView
from memstore.tokens import FixedCounter


def require(module: str) -> ModuleType:
    """Import ``module``; skip the calling test module without it (fail under ``CI=true``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = f"{module} is not installed ({exc}); `pip install -e '.[test]'` installs it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (required when CI=true)", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def assert_openai_history_valid(messages: list[dict[str, object]]) -> None:
    """Fail unless an OpenAI chat history pairs every tool call with its results.

    What providers check: every ``tool`` message answers a call of the assistant
    message right before its run of tool messages, and every call of an assistant
    message is answered before the next non-tool message (or the end).
    """
    open_ids: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            assert call_id in open_ids, f"message {index}: orphan tool result {call_id!r}"
            open_ids.discard(str(call_id))
            continue
        assert not open_ids, f"message {index}: unanswered tool calls {sorted(open_ids)}"
        calls = message.get("tool_calls") or []
        open_ids = {str(c["id"]) for c in calls}  # type: ignore[index, union-attr]
    assert not open_ids, f"unanswered tool calls at the end: {sorted(open_ids)}"


async def open_store(kind: str, url: str, counter: object = None) -> object:
    """A new MemoryStore (``kind="sync"``) or AsyncMemoryStore on ``url``."""
    from memstore import AsyncMemoryStore, MemoryStore

    if kind == "sync":
        return MemoryStore(url, counter=counter)  # type: ignore[arg-type]
    store = AsyncMemoryStore(url, counter=counter)  # type: ignore[arg-type]
    await store.setup()
    return store


async def close_store(store: object) -> None:
    """Close a store of either kind."""
    result = store.close()  # type: ignore[attr-defined]
    if result is not None:
        await result


def assert_constructor_refuses_what_the_store_would(
    adapter: Callable[..., object], store: object, id_name: str
) -> None:
    """An adapter refuses a bad conversation id by the store's own rule (naming its own
    argument ``id_name``), a store that is not one, and a view that is not one."""
    from memstore import ConfigurationError, InvalidInputError

    for bad in ("", "a\x00", "x" * 256, 7):
        with pytest.raises(InvalidInputError, match=id_name):
            adapter(bad, store)
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        adapter("c", object())
    with pytest.raises(ConfigurationError, match="view"):
        adapter("c", store, view="all")


#: Budgeted views whose history must leave room for the turn in progress (the LangChain
#: and autogen adapters charge it to the budget).
BUDGETED_VIEWS = [
    TokenLimitedView(token_limit=100, reserve=10),
    TokenLimitedView(token_limit=100, reserve=10, start_on_user=True),
    ScoreBasedView(token_limit=100, reserve=10),
    SummaryView(token_limit=100, reserve=10),
    # the view's own counter, not the store's, counts the window and the turn in progress
    TokenLimitedView(token_limit=100, reserve=10,
                     counter=FixedCounter(per_message=5, per_word=2, priming=1)),
]
