"""Recall: full-text search over everything a store holds (the pure part, no SQL).

[`MemoryStore.search()`][memstore.MemoryStore.search] (and its async twin) returns
[`SearchHit`][memstore.SearchHit] objects, best match first. This module holds what
both databases share and what needs no database: the hit model, the query language
and its translation, the text a message is indexed by, and the snippets. The SQL
(the FTS5 table on SQLite, the ``tsvector`` table on PostgreSQL, the triggers that
keep both in step with every write) lives in `memstore._db.search`.

What is indexed: a message's text (its string content or its text parts), the names
and arguments of its tool calls, and tool results (a ``tool`` message's text); the
first `MAX_INDEXED_CHARS` characters of that, joined by newlines (see
`searchable_text()`). Not metadata, ids or roles (roles are a filter).

The query language is PostgreSQL's ``websearch_to_tsquery``'s: plain words are ANDed,
``"a quoted phrase"`` matches its words in order, ``OR`` (any case) between two
terms matches either, and ``-word`` (or ``-"a phrase"``) excludes. ``OR`` binds
looser than the implicit AND: ``a b OR c`` is ``(a AND b) OR c``. Punctuation inside a
word joins its parts into a phrase (``e-mail``, ``example.com``, ``don't``). Every
term reaches the database quoted, so no query can inject operators or column
filters; a query is either searched or refused with
[`InvalidInputError`][memstore.InvalidInputError] naming the problem.

Tokens are what SQLite's ``unicode61`` tokenizer makes of text (with
``remove_diacritics 2``): runs of letters and digits, case-folded, Latin diacritics
removed. PostgreSQL indexes the same runs: before its ``simple`` parser sees the
text, memstore replaces every character ``unicode61`` treats as a separator with a
space and removes the same diacritics (`fold()`, the same function in Python and in
SQL), so the two databases find the same messages for queries of ASCII words.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, PrivateAttr, computed_field, model_validator

from memstore._validate import WhereValue, short_repr, text_problem
from memstore.errors import InvalidInputError
from memstore.models.common import _FROZEN, ROLES
from memstore.models.message import StoredMessage
from memstore.models.parts import TextPart, ToolCall

__all__ = [
    "DEFAULT_MARK",
    "LANGUAGES",
    "MAX_CONTEXT",
    "MAX_INDEXED_CHARS",
    "MAX_LIMIT",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "Language",
    "Query",
    "SearchHit",
    "SearchRequest",
    "Term",
    "fold",
    "parse_query",
    "searchable_text",
    "snippet",
]

#: The text-search configurations: ``"simple"`` (the default: no stemming, no stop
#: words, any language) or ``"english"`` (English stemming; PostgreSQL also drops
#: English stop words). Chosen when migration 0005 creates the index.
Language = Literal["simple", "english"]
LANGUAGES: tuple[Language, ...] = ("simple", "english")

#: Characters of a message's searchable text that are indexed (the rest is not):
#: PostgreSQL's ``tsvector`` holds at most 1 MB, which this keeps every message within.
MAX_INDEXED_CHARS = 100_000
#: Longest query, in characters.
MAX_QUERY_CHARS = 10_000
#: Most terms (words and phrases) one query may hold.
MAX_QUERY_TERMS = 256
#: Most hits one search returns.
MAX_LIMIT = 1000
#: Most messages of context a hit carries on each side.
MAX_CONTEXT = 50
#: What wraps a matched word in a snippet, by default.
DEFAULT_MARK = ("[", "]")
#: Longest snippet mark, in characters.
MAX_MARK_CHARS = 100
#: Words a snippet shows (at most).
SNIPPET_WORDS = 24
ELLIPSIS = "\u2026"

# ---- tokens: SQLite's unicode61, replayed ----------------------------------------------

#: The code points SQLite's ``unicode61`` tokenizer (``remove_diacritics 2``) treats as
#: separators, as hexadecimal ranges: its Unicode 6.1 tables, read from SQLite itself
#: (tests/test_search_text.py reads them again and compares). Everything else is a
#: token character.
_SEPARATOR_RANGES = (
    "1-2f,3a-40,5b-60,7b-a9,ab-b1,b4,b6-b8,bb,bf,d7,f7,2c2-2c5,2d2-2df,2e5-2eb,2ed,"
    "2ef-2ff,305,30d-30e,310,312-31a,31c-322,329-32c,32f,332-36f,375,37e,384-385,387,3f6,"
    "482-489,55a-55f,589-58a,58f,591-5c7,5f3-5f4,600-604,606-61b,61e-61f,64b-65f,66a-66d,"
    "670,6d4,6d6-6e4,6e7-6ed,6fd-6fe,700-70d,70f,711,730-74a,7a6-7b0,7eb-7f3,7f6-7f9,"
    "816-819,81b-823,825-827,829-82d,830-83e,859-85b,85e,8e4-8fe,900-903,93a-93c,93e-94f,"
    "951-957,962-965,970,981-983,9bc,9be-9c4,9c7-9c8,9cb-9cd,9d7,9e2-9e3,9f2-9f3,9fa-9fb,"
    "a01-a03,a3c,a3e-a42,a47-a48,a4b-a4d,a51,a70-a71,a75,a81-a83,abc,abe-ac5,ac7-ac9,"
    "acb-acd,ae2-ae3,af0-af1,b01-b03,b3c,b3e-b44,b47-b48,b4b-b4d,b56-b57,b62-b63,b70,b82,"
    "bbe-bc2,bc6-bc8,bca-bcd,bd7,bf3-bfa,c01-c03,c3e-c44,c46-c48,c4a-c4d,c55-c56,c62-c63,"
    "c7f,c82-c83,cbc,cbe-cc4,cc6-cc8,cca-ccd,cd5-cd6,ce2-ce3,d02-d03,d3e-d44,d46-d48,"
    "d4a-d4d,d57,d62-d63,d79,d82-d83,dca,dcf-dd4,dd6,dd8-ddf,df2-df4,e31,e34-e3a,e3f,"
    "e47-e4f,e5a-e5b,eb1,eb4-eb9,ebb-ebc,ec8-ecd,f01-f1f,f34-f3f,f71-f87,f8d-f97,f99-fbc,"
    "fbe-fcc,fce-fda,102b-103e,104a-104f,1056-1059,105e-1060,1062-1064,1067-106d,"
    "1071-1074,1082-108d,108f,109a-109f,10fb,135d-1368,1390-1399,1400,166d-166e,1680,"
    "169b-169c,16eb-16ed,1712-1714,1732-1736,1752-1753,1772-1773,17b4-17d6,17d8-17db,"
    "17dd,1800-180e,18a9,1920-192b,1930-193b,1940,1944-1945,19b0-19c0,19c8-19c9,"
    "19de-19ff,1a17-1a1b,1a1e-1a1f,1a55-1a5e,1a60-1a7c,1a7f,1aa0-1aa6,1aa8-1aad,"
    "1b00-1b04,1b34-1b44,1b5a-1b7c,1b80-1b82,1ba1-1bad,1be6-1bf3,1bfc-1bff,1c24-1c37,"
    "1c3b-1c3f,1c7e-1c7f,1cc0-1cc7,1cd0-1ce8,1ced,1cf2-1cf4,1dc0-1de6,1dfc-1dff,1fbd,"
    "1fbf-1fc1,1fcd-1fcf,1fdd-1fdf,1fed-1fef,1ffd-1ffe,2000-2064,206a-206f,207a-207e,"
    "208a-208e,20a0-20b9,20d0-20f0,2100-2101,2103-2106,2108-2109,2114,2116-2118,"
    "211e-2123,2125,2127,2129,212e,213a-213b,2140-2144,214a-214d,214f,2190-23f3,"
    "2400-2426,2440-244a,249c-24e9,2500-26ff,2701-2775,2794-2b4c,2b50-2b59,2ce5-2cea,"
    "2cef-2cf1,2cf9-2cfc,2cfe-2cff,2d70,2d7f,2de0-2e2e,2e30-2e3b,2e80-2e99,2e9b-2ef3,"
    "2f00-2fd5,2ff0-2ffb,3000-3004,3008-3020,302a-3030,3036-3037,303d-303f,3099-309c,"
    "30a0,30fb,3190-3191,3196-319f,31c0-31e3,3200-321e,322a-3247,3250,3260-327f,"
    "328a-32b0,32c0-32fe,3300-33ff,4dc0-4dff,a490-a4c6,a4fe-a4ff,a60d-a60f,a66f-a67e,"
    "a69f,a6f0-a6f7,a700-a716,a720-a721,a789-a78a,a802,a806,a80b,a823-a82b,a836-a839,"
    "a874-a877,a880-a881,a8b4-a8c4,a8ce-a8cf,a8e0-a8f1,a8f8-a8fa,a926-a92f,a947-a953,"
    "a95f,a980-a983,a9b3-a9cd,a9de-a9df,aa29-aa36,aa43,aa4c-aa4d,aa5c-aa5f,aa77-aa79,"
    "aa7b,aab0,aab2-aab4,aab7-aab8,aabe-aabf,aac1,aade-aadf,aaeb-aaf1,aaf5-aaf6,"
    "abe3-abed,fb1e,fb29,fbb2-fbc1,fd3e-fd3f,fdfc-fdfd,fe00-fe19,fe20-fe26,fe30-fe52,"
    "fe54-fe66,fe68-fe6b,feff,ff01-ff0f,ff1a-ff20,ff3b-ff40,ff5b-ff65,ffe0-ffe6,"
    "ffe8-ffee,fff9-ffff,10100-10102,10137-1013f,10179-10189,10190-1019b,101d0-101fd,"
    "1039f,103d0,10857,1091f,1093f,10a01-10a03,10a05-10a06,10a0c-10a0f,10a38-10a3a,10a3f,"
    "10a50-10a58,10a7f,10b39-10b3f,11000-11002,11038-1104d,11080-11082,110b0-110c1,"
    "11100-11102,11127-11134,11140-11143,11180-11182,111b3-111c0,111c5-111c8,116ab-116b7,"
    "12470-12473,16f51-16f7e,16f8f-16f92,1d000-1d0f5,1d100-1d126,1d129-1d1dd,1d200-1d245,"
    "1d300-1d356,1d6c1,1d6db,1d6fb,1d715,1d735,1d74f,1d76f,1d789,1d7a9,1d7c3,1eef0-1eef1,"
    "1f000-1f02b,1f030-1f093,1f0a0-1f0ae,1f0b1-1f0be,1f0c1-1f0cf,1f0d1-1f0df,1f110-1f12e,"
    "1f130-1f16b,1f170-1f19a,1f1e6-1f202,1f210-1f23a,1f240-1f248,1f250-1f251,1f300-1f320,"
    "1f330-1f335,1f337-1f37c,1f380-1f393,1f3a0-1f3c4,1f3c6-1f3ca,1f3e0-1f3f0,1f400-1f43e,"
    "1f440,1f442-1f4f7,1f4f9-1f4fc,1f500-1f53d,1f540-1f543,1f550-1f567,1f5fb-1f640,"
    "1f645-1f64f,1f680-1f6c5,1f700-1f773,e0001,e0020-e007f,e0100-e01ef")

#: The combining marks ``remove_diacritics 2`` removes from inside a token (after
#: canonical decomposition, a Latin letter with a diacritic is its base letter and
#: these marks).
REMOVED_MARKS = (
    "\u0300\u0301\u0302\u0303\u0304\u0306\u0307\u0308\u0309\u030a\u030b\u030c\u030f"
    "\u0311\u031b\u0323\u0324\u0325\u0326\u0327\u0328\u032d\u032e\u0330\u0331"
)


def separator_ranges() -> list[tuple[int, int]]:
    """`_SEPARATOR_RANGES` as ``(first, last)`` code point pairs."""
    out = []
    for item in "".join(_SEPARATOR_RANGES).split(","):
        first, _, last = item.partition("-")
        out.append((int(first, 16), int(last or first, 16)))
    return out


def _escape(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def bracket(ranges: Iterable[tuple[int, int]]) -> str:
    r"""The inside of a regular-expression bracket matching ``ranges``.

    Every character is a ``\uXXXX``/``\UXXXXXXXX`` escape, which Python's ``re`` and
    PostgreSQL's regular expressions both read.
    """
    return "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)


_SEPARATORS = separator_ranges()
_ASCII_SEPARATORS = [(a, min(b, 0x7F)) for a, b in _SEPARATORS if a <= 0x7F]
_SEPARATOR_RE = re.compile(f"[{bracket(_SEPARATORS)}]+")
_TOKEN_RE = re.compile(f"[^{bracket(_SEPARATORS)}]+")
_ASCII_FOLD = str.maketrans({cp: " " for a, b in _ASCII_SEPARATORS for cp in range(a, b + 1)})
_MARKS_FOLD = str.maketrans({**{mark: None for mark in REMOVED_MARKS}, "\u017f": "s"})


def fold(text: str) -> str:
    """``text`` as PostgreSQL's parser is given it: what ``unicode61`` would tokenize.

    Canonical decomposition, the diacritics ``remove_diacritics 2`` removes, long s as
    s, and every separator as a space. ASCII text only has its separators replaced.
    The SQL function ``memstore_search_fold`` (migration 0005) is this function.
    """
    if text.isascii():
        return text.translate(_ASCII_FOLD)
    decomposed = unicodedata.normalize("NFD", text).translate(_MARKS_FOLD)
    return _SEPARATOR_RE.sub(" ", decomposed)


def searchable_text(content: str | Sequence[Any] | None,
                    tool_calls: Sequence[ToolCall] | None) -> str:
    """The text a message is indexed by.

    Its string content, or each of its text parts; then the name and the arguments of
    each tool call; joined by newlines, and cut at `MAX_INDEXED_CHARS` characters. The
    triggers of migration 0005 compute the same text from the stored row.
    """
    pieces: list[str] = []
    if isinstance(content, str):
        pieces.append(content)
    elif content:
        pieces.extend(part.text for part in content if isinstance(part, TextPart))
    for call in tool_calls or ():
        pieces.append(call.name)
        pieces.append(call.arguments)
    return "\n".join(pieces)[:MAX_INDEXED_CHARS]


def _key(word: str) -> str:
    """A token's comparison key: folded and lower-cased (one token)."""
    return "".join(fold(word).lower().split())


_SUFFIXES = ("ational", "ization", "fulness", "ousness", "iveness", "ations", "ation",
             "ements", "ement", "ments", "ment", "ness", "ingly", "edly", "ing", "ies",
             "ied", "ers", "er", "ed", "es", "ly", "s")


def _stem(key: str) -> str:
    """A rough English stem, for highlighting under the ``english`` configuration only.

    The databases stem with Porter's (SQLite) and Snowball's (PostgreSQL) stemmers;
    this only decides which words of a snippet to mark.
    """
    for _ in range(2):  # mornings -> morning -> morn
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) - len(suffix) >= 3:
                key = key[: -len(suffix)]
                if key[-1] == key[-2] and key[-1] not in "aeiousl":
                    key = key[:-1]  # running -> run, stopped -> stop
                break
    return key


# ---- the query language ------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One word or quoted phrase of a query, as written.

    Attributes:
        text: the word, or the inside of the quotes; the database tokenizes it, and a
            term of several tokens matches them as a phrase.
        exclude: the term was prefixed with ``-``: matching messages must not hold it.
    """

    text: str
    exclude: bool = False


def _fts5_string(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _tsquery_operand(text: str) -> str:
    folded = " ".join(fold(text).split())
    return "'" + folded.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True)
class Query:
    """A parsed query: an OR of groups, each an AND of terms (some of them excluded).

    Every group holds at least one term that is not excluded.
    """

    source: str
    groups: tuple[tuple[Term, ...], ...]

    def fts5(self) -> str:
        """The query as an FTS5 ``MATCH`` expression (every term a quoted string)."""
        out = []
        for group in self.groups:
            include = " AND ".join(_fts5_string(t.text) for t in group if not t.exclude)
            expression = f"({include})"
            for term in group:
                if term.exclude:
                    expression = f"({expression} NOT {_fts5_string(term.text)})"
            out.append(expression)
        return " OR ".join(out)

    def tsquery(self) -> str:
        """The query as ``to_tsquery`` text (every term quoted, folded as indexed)."""
        out = []
        for group in self.groups:
            parts = [("!" if t.exclude else "") + _tsquery_operand(t.text) for t in group]
            out.append("(" + " & ".join(parts) + ")")
        return " | ".join(out)

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        """The comparison keys of the words of every term that is not excluded."""
        return frozenset(
            key for group in self.groups for term in group if not term.exclude
            for word in _TOKEN_RE.findall(term.text) if (key := _key(word)))


def _tokens(query: str) -> list[tuple[str, str, bool]]:
    """``query`` as ``(kind, text, excluded)``: kind ``"word"``, ``"phrase"`` or ``"or"``."""
    out: list[tuple[str, str, bool]] = []
    negate = False
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            end = query.find('"', i + 1)
            end = n if end < 0 else end
            out.append(("phrase", query[i + 1:end], negate))
            negate = False
            i = end + 1
            continue
        start = i
        while i < n and not query[i].isspace() and query[i] != '"':
            i += 1
        word = query[start:i]
        dashes = len(word) - len(word.lstrip("-"))
        word = word[dashes:]
        negate ^= dashes % 2 == 1
        if not word:
            continue  # dashes alone: they apply to the next term
        if word.lower() == "or" and not negate:
            out.append(("or", word, False))
        else:
            out.append(("word", word, negate))
        negate = False
    return out


def _searchable(text: str) -> bool:
    """Whether ``text`` holds a token (a word any database indexes)."""
    return bool(fold(text).split())


def parse_query(query: object) -> Query:
    """Parse a search query (``websearch_to_tsquery``'s language; see the module).

    Raises:
        InvalidInputError: not a string; blank or nothing but punctuation ("nothing to
            search for"); text databases cannot store (NUL, a lone surrogate); longer
            than `MAX_QUERY_CHARS` characters or more than `MAX_QUERY_TERMS` terms; a
            group of terms that only excludes (``-cat`` alone, or ``a OR -b``).
    """
    if not isinstance(query, str):
        raise InvalidInputError(f"query must be a str, not {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInputError(
            f"query is {len(query)} characters long; the maximum is {MAX_QUERY_CHARS}")
    problem = text_problem(query)
    if problem is not None:
        raise InvalidInputError(f"query {problem}")
    tokens = _tokens(query)
    # OR between two terms is the operator; anywhere else it is the word "or".
    groups: list[list[Term]] = [[]]
    previous_is_term = False
    for index, (kind, text, exclude) in enumerate(tokens):
        if kind == "or":
            if previous_is_term and index + 1 < len(tokens):
                groups.append([])
                previous_is_term = False
                continue
            kind = "word"
        if _searchable(text):
            groups[-1].append(Term(text, exclude))
        previous_is_term = True
    terms = sum(len(group) for group in groups)
    if terms > MAX_QUERY_TERMS:
        raise InvalidInputError(
            f"query holds {terms} terms; the maximum is {MAX_QUERY_TERMS}")
    kept: list[tuple[Term, ...]] = []
    for group in groups:
        if not group:
            continue
        if all(term.exclude for term in group):
            excluded = " ".join("-" + _show(term) for term in group)
            raise InvalidInputError(
                f"query {short_repr(query)}: {excluded} only excludes; give a word to "
                "search for beside it (an excluded word narrows a search, as in "
                "'cat -dog')")
        kept.append(tuple(group))
    if not kept:
        raise InvalidInputError(
            f"nothing to search for: query {short_repr(query)} holds no word "
            "(letters or digits)")
    return Query(query, tuple(kept))


def _show(term: Term) -> str:
    text = term.text if len(term.text) <= 30 else term.text[:27] + "..."
    return f'"{text}"' if " " in text or not text else text


# ---- snippets ----------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")
#: Longest stretch of a snippet between two words, and longest word shown whole.
_GAP = 24
_LONG_WORD = 60


def _shown(text: str, limit: int) -> str:
    text = _SPACE.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


_ASCII_TOKEN = re.compile(r"[A-Za-z0-9]+")
#: Matches scored when choosing a snippet's stretch (a word repeated thousands of times
#: in a long tool output is looked at this many times).
_SCORED_MATCHES = 64


@functools.lru_cache(maxsize=256)
def _ascii_pattern(keys: frozenset[str]) -> re.Pattern[str]:
    alternatives = "|".join(sorted((re.escape(k) for k in keys), key=len, reverse=True))
    return re.compile(f"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])", re.IGNORECASE)


def snippet(text: str, keys: frozenset[str], mark: tuple[str, str] = DEFAULT_MARK, *,
            stemmed: bool = False, words: int = SNIPPET_WORDS) -> str:
    """A short excerpt of ``text`` around its matched words, each wrapped in ``mark``.

    The excerpt shows up to ``words`` words: the stretch holding the most distinct
    matched words (then the most matches), starting a few words before the first.
    Whitespace is collapsed; ``…`` marks text left out before or after.

    Args:
        text: the message's searchable text.
        keys: the comparison keys of the query's words (`Query.keys`).
        mark: what goes before and after a matched word.
        stemmed: compare rough English stems (the ``english`` configuration).
        words: how many words to show.
    """
    if not stemmed and keys and text.isascii() and all(k.isascii() for k in keys):
        return _ascii_snippet(text, keys, mark, words)
    if stemmed:
        keys = frozenset(_stem(k) for k in keys)
    spans = [m.span() for m in _TOKEN_RE.finditer(text)]
    found = []
    for i, (a, b) in enumerate(spans):
        key = _key(text[a:b])
        if stemmed:
            key = _stem(key)
        if key in keys:
            found.append((i, key))
    return _excerpt(text, spans, found, mark, words)


def _ascii_snippet(text: str, keys: frozenset[str], mark: tuple[str, str], words: int) -> str:
    """`snippet()` of ASCII text, in time that does not grow with the text.

    The matches are found by one regular expression, and only the stretch around the
    best of them is split into words.
    """
    found: list[tuple[int, str]] = []
    for match in _ascii_pattern(keys).finditer(text):
        found.append((match.start(), match.group().lower()))
        if len(found) >= 4 * _SCORED_MATCHES:
            break
    low = anchor = 0
    if found:
        reach = words * 8
        best: tuple[int, int] = (-1, -1)
        for at, _ in found[:_SCORED_MATCHES]:
            inside = [key for other, key in found if at - 16 <= other < at + reach]
            score = (len(set(inside)), len(inside))
            if score > best:
                best, anchor = score, at
        low = max(0, anchor - 160)
    high = min(len(text), anchor + words * 12 + 160)
    spans = [m.span() for m in _ASCII_TOKEN.finditer(text, low, high)]
    if len(spans) > 1 and low > 0 and spans[0][0] == low and text[low - 1].isalnum():
        spans = spans[1:]  # a word cut by the stretch's start
    if len(spans) > 1 and high < len(text) and spans[-1][1] == high and text[high].isalnum():
        spans = spans[:-1]
    index = {a: i for i, (a, _) in enumerate(spans)}
    matched = [(index[at], key) for at, key in found if at in index]
    before = bool(spans) and _ASCII_TOKEN.search(text, 0, spans[0][0]) is not None
    after = bool(spans) and _ASCII_TOKEN.search(text, spans[-1][1]) is not None
    return _excerpt(text, spans, matched, mark, words, before=before, after=after)


def _excerpt(text: str, spans: list[tuple[int, int]], found: list[tuple[int, str]],
             mark: tuple[str, str], words: int, *, before: bool = False,
             after: bool = False) -> str:
    """The snippet of ``text`` whose words are ``spans``, the matched ones ``found``.

    ``before``/``after``: ``text`` has words outside ``spans`` (a stretch of it).
    """
    if not spans:
        return _shown(text.strip(), words * 8)
    start = 0
    if found:
        lead = min(3, words // 4)
        best: tuple[int, int] = (-1, -1)
        for i, _ in found[:_SCORED_MATCHES]:
            first = max(0, min(i - lead, len(spans) - words))
            inside = [key for j, key in found if first <= j < first + words]
            score = (len(set(inside)), len(inside))
            if score > best:
                best, start = score, first
    end = min(len(spans), start + words)
    matched = {i for i, _ in found}
    out = ([ELLIPSIS + " "] if start > 0 or before
           else [_shown(text[:spans[0][0]].lstrip(), _GAP)])
    for i in range(start, end):
        a, b = spans[i]
        if i > start:
            gap = text[spans[i - 1][1]:a]
            out.append(" " if gap == " " else _shown(gap, _GAP))
        word = text[a:b] if b - a <= _LONG_WORD else _shown(text[a:b], _LONG_WORD)
        out.append(f"{mark[0]}{word}{mark[1]}" if i in matched else word)
    if end < len(spans) or after:
        out.append(ELLIPSIS if out[-1].endswith(" ") else " " + ELLIPSIS)
    else:
        out.append(_shown(text[spans[-1][1]:].rstrip(), _GAP))
    return "".join(out).strip()


# ---- requests and hits -------------------------------------------------------------------


@dataclass(frozen=True)
class SearchRequest:
    """A search's checked arguments (what `memstore._db.search` runs)."""

    query: Query
    conversation_ids: tuple[str, ...] | None
    where: Mapping[str, WhereValue] | None
    roles: tuple[str, ...] | None
    since: datetime | None
    until: datetime | None
    limit: int
    context: int
    mark: tuple[str, str]


def check_limit(value: Any, name: str = "limit", high: int = MAX_LIMIT) -> int:
    """An int in ``[1, high]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise InvalidInputError(f"{name} must be an int in [1, {high}], got {short_repr(value)}")
    return value


def check_context(value: Any) -> int:
    """Messages of context on each side: an int in ``[0, MAX_CONTEXT]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_CONTEXT:
        raise InvalidInputError(
            f"context must be an int in [0, {MAX_CONTEXT}], got {short_repr(value)}")
    return value


def check_mark(value: Any) -> tuple[str, str]:
    """A snippet mark: two strings (before, after) of storable text."""
    if (isinstance(value, (str, bytes)) or not isinstance(value, Sequence)
            or len(value) != 2 or not all(isinstance(v, str) for v in value)):
        raise InvalidInputError(
            f"mark must be a pair of strings (before, after), got {short_repr(value)}")
    for side in value:
        problem = text_problem(side) or (
            f"is longer than {MAX_MARK_CHARS} characters" if len(side) > MAX_MARK_CHARS
            else None)
        if problem is not None:
            raise InvalidInputError(f"mark {short_repr(side)} {problem}")
    return (value[0], value[1])


def check_roles(value: Any) -> tuple[str, ...] | None:
    """Roles to keep: ``None`` (all), one role, or an iterable of roles."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidInputError(
            f"roles must be a list of roles ({', '.join(ROLES)}), got {short_repr(value)}")
    out: list[str] = []
    for role in items:
        if role not in ROLES:
            raise InvalidInputError(
                f"roles: {short_repr(role)} is not a role (one of {', '.join(ROLES)})")
        if role not in out:
            out.append(role)
    return tuple(out)


def check_moment(value: Any, name: str) -> datetime | None:
    """A ``since``/``until`` bound: ``None`` or a timezone-aware datetime."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(
            f"{name} must be a timezone-aware datetime or None, got {short_repr(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{name} must be timezone-aware (a naive datetime could be any time zone): "
            f"got {value.isoformat()}")
    return value


class SearchHit(BaseModel):
    """One message a search found.

    Attributes:
        conversation_id: the conversation holding it.
        message: the stored message.
        rank: how well it matches: higher is better, comparable within one result list
            only (BM25 on SQLite, cover density on PostgreSQL).
        snippet: a short excerpt of its searchable text around the matched words, each
            wrapped in the search's ``mark`` (``[``…``]`` by default). Made when first
            read (a caller that never reads it does not pay for it).
        before: up to ``context`` messages just before it in its conversation, oldest
            first.
        after: up to ``context`` messages just after it, oldest first.
    """

    model_config = _FROZEN

    conversation_id: str
    message: StoredMessage
    rank: float
    before: tuple[StoredMessage, ...] = ()
    after: tuple[StoredMessage, ...] = ()
    _snippet: str | None = PrivateAttr(default=None)
    _recipe: tuple[frozenset[str], tuple[str, str], bool] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _given_snippet(cls, data: Any, handler: Any) -> Any:
        """Accept ``snippet=`` (as ``model_dump()`` gives it back)."""
        given = None
        if isinstance(data, Mapping) and "snippet" in data:
            data = dict(data)
            given = data.pop("snippet")
            if not isinstance(given, str):
                raise ValueError(f"snippet must be a str, got {short_repr(given)}")
        hit = handler(data)
        if given is not None:
            hit._snippet = given
        return hit

    @classmethod
    def found(cls, message: StoredMessage, rank: float, keys: frozenset[str],
              mark: tuple[str, str], *, stemmed: bool = False,
              before: tuple[StoredMessage, ...] = (),
              after: tuple[StoredMessage, ...] = ()) -> SearchHit:
        """A hit as a search makes it (trusted values; its snippet made when first read)."""
        hit = cls.model_construct(conversation_id=message.conversation_id, message=message,
                                  rank=rank, before=before, after=after)
        hit._recipe = (keys, mark, stemmed)
        return hit

    @computed_field  # type: ignore[prop-decorator]
    @property
    def snippet(self) -> str:
        """A short excerpt around the matched words (see the class)."""
        if self._snippet is None:
            keys, mark, stemmed = self._recipe or (frozenset(), DEFAULT_MARK, False)
            message = self.message
            self._snippet = snippet(searchable_text(message.content, message.tool_calls),
                                    keys, mark, stemmed=stemmed)
        return self._snippet

    @property
    def seq(self) -> int:
        """The message's seq."""
        return self.message.seq

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SearchHit):
            return NotImplemented
        return (self.conversation_id, self.message, self.rank, self.before, self.after,
                self.snippet) == (other.conversation_id, other.message, other.rank,
                                  other.before, other.after, other.snippet)

    def __hash__(self) -> int:
        return hash((self.conversation_id, self.message.seq, self.rank))
