"""Image pricing: OpenAI's tile and patch rules by model, and the counters that use them.

Every expected value comes from OpenAI's "Images and vision" guide, "Calculating costs"
(https://platform.openai.com/docs/guides/images-vision#calculating-costs) or follows from
its rules; see memstore/tokens/_images.py.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from memstore.errors import ConfigurationError
from memstore.models import Message, TextPart
from memstore.tokens import ApproxCounter, TiktokenCounter, _images, counter_from_name
from tests.test_tokens import data_uri, gif, image, jpeg, png

REMOTE = "https://example.com/cat.png"


@pytest.fixture(scope="module")
def cl100k() -> TiktokenCounter:
    return TiktokenCounter("cl100k_base")


def image_cost(counter: Any, part: Any) -> int:
    """What one image part adds to a user message under ``counter``."""
    text = TextPart(text="What is this?")
    return counter.count_message(Message.user([text, part])) - counter.count_message(
        Message.user([text])
    )


# ---- ApproxCounter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "tokens"),
    [
        (image(data_uri(png(2048, 2048)), "high"), 765),  # was 85: 9x under
        (image(data_uri(png(1024, 1024))), 765),
        (image(data_uri(jpeg(1920, 1080), "image/jpeg"), "auto"), 85 + 170 * 6),
        (image(data_uri(gif(64, 64), "image/gif")), 85 + 170),
        (image(REMOTE, "high"), 1445),  # size unknown: the most the rule allows (was 85)
        (image(REMOTE), 1445),
        (image(REMOTE, "low"), 85),
        (image(data_uri(png(4000, 4000)), "low"), 85),
    ],
)
def test_approx_counter_prices_images_like_the_tiktoken_counter(
    cl100k: TiktokenCounter, part: Any, tokens: int
) -> None:
    assert image_cost(ApproxCounter(), part) == tokens
    assert image_cost(ApproxCounter(2.5), part) == tokens  # not a text ratio
    assert image_cost(cl100k, part) == tokens


def test_approx_counter_image_message() -> None:
    c = ApproxCounter()
    pic = Message.user([TextPart(text="abcdefgh"), image(data_uri(png(2048, 2048)), "high"),
                        image(REMOTE, "low")])
    assert c.count_message(pic) == 3 + 2 + 765 + 85
    assert c.name == "approx/4"


# ---- rules by model -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        ("gpt-4o", "tiles-85-170"),
        ("gpt-4o-2024-08-06", "tiles-85-170"),
        ("chatgpt-4o-latest", "tiles-85-170"),
        ("gpt-4.1", "tiles-85-170"),
        ("gpt-4.5-preview", "tiles-85-170"),
        ("gpt-4-turbo", "tiles-85-170"),
        ("gpt-4o-mini", "tiles-2833-5667"),
        ("gpt-4o-mini-2024-07-18", "tiles-2833-5667"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "tiles-2833-5667"),
        ("o1", "tiles-75-150"),
        ("o1-2024-12-17", "tiles-75-150"),
        ("o1-pro", "tiles-75-150"),
        ("o3", "tiles-75-150"),
        ("gpt-5", "tiles-70-140"),
        ("gpt-5-chat-latest", "tiles-70-140"),
        ("computer-use-preview", "tiles-65-129"),
        ("gpt-4.1-mini", "patches-1.62"),
        ("gpt-4.1-mini-2025-04-14", "patches-1.62"),
        ("gpt-5-mini", "patches-1.62"),
        ("gpt-4.1-nano", "patches-2.46"),
        ("gpt-5-nano", "patches-2.46"),
        ("o4-mini", "patches-1.72"),
        ("GPT-4o-mini", "tiles-2833-5667"),
        ("gpt-5.1", "tiles-85-170"),  # not in OpenAI's table: the default
        ("some-future-model", "tiles-85-170"),
    ],
)
def test_rule_by_model(model: str, spec: str) -> None:
    assert _images.image_rule_for_model(model).spec == spec


def test_tile_rules() -> None:
    mini = _images.image_rule_from_spec("tiles-2833-5667")
    assert image_cost_rule(mini, image(REMOTE, "low")) == 2833
    assert image_cost_rule(mini, image(data_uri(png(1024, 1024)), "high")) == 2833 + 5667 * 4
    assert image_cost_rule(mini, image(data_uri(png(128, 64)))) == 2833 + 5667
    assert image_cost_rule(mini, image(REMOTE)) == 2833 + 5667 * 8 == mini.max_tokens
    o1 = _images.image_rule_for_model("o1")
    assert image_cost_rule(o1, image(data_uri(png(2048, 4096)))) == 75 + 150 * 6


def image_cost_rule(rule: _images.ImageRule, part: Any) -> int:
    return rule.tokens(part)


@pytest.mark.parametrize(
    ("width", "height", "patches"),
    [
        (1024, 1024, 1024),  # OpenAI's example: 32x32 patches, under the cap
        (1800, 2400, 1452),  # OpenAI's example: scaled to 1056x1408, 33x44 patches
        (2400, 1800, 1452),
        (128, 64, 8),
        (33, 33, 4),  # a partial patch counts whole
        (1, 1, 1),
        (1536 * 32, 32, 1536),  # a strip exactly at the cap
        (100_000, 1, 1536),  # degenerate: never more than the cap
        (4096, 4096, 1521),  # 39 x 39 after scaling
    ],
)
def test_patch_rule_counts_patches(width: int, height: int, patches: int) -> None:
    assert _images._patches(width, height) == patches
    assert _images._patches(width, height) <= 1536


def test_patch_rules_apply_the_multiplier_rounding_up() -> None:
    mini = _images.image_rule_for_model("gpt-4.1-mini")
    nano = _images.image_rule_for_model("gpt-4.1-nano")
    o4 = _images.image_rule_for_model("o4-mini")
    big = image(data_uri(png(1024, 1024)), "high")
    assert image_cost_rule(mini, big) == 1659  # ceil(1024 * 1.62)
    assert image_cost_rule(nano, big) == 2520  # ceil(1024 * 2.46) = 2519.04 -> 2520
    assert image_cost_rule(o4, big) == 1762  # ceil(1761.28)
    # no documented low-detail discount: low costs the same as high
    assert image_cost_rule(mini, image(data_uri(png(1024, 1024)), "low")) == 1659
    # size unknown: the cap, 1536 patches
    assert image_cost_rule(mini, image(REMOTE)) == 2489 == mini.max_tokens  # ceil(2488.32)


# ---- TiktokenCounter(model=...) and names --------------------------------------------------


def test_gpt_4o_mini_images_through_model(
    cl100k: TiktokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # o200k_base is not available offline here; the cl100k encoding stands in for it.
    monkeypatch.setattr("memstore.tokens._openai._load_encoding", lambda name: cl100k.encoding)
    mini = TiktokenCounter(model="gpt-4o-mini")
    assert mini.encoding_name == "o200k_base"
    assert mini.name == "tiktoken/o200k_base/images=tiles-2833-5667"
    assert mini.image_rule == "tiles-2833-5667"
    assert image_cost(mini, image(REMOTE, "low")) == 2833
    assert image_cost(mini, image(data_uri(png(1024, 1024)))) == 2833 + 5667 * 4
    assert image_cost(mini, image(REMOTE)) == 48169
    # text is counted as before: only the image rule differs
    assert mini.count_message(Message.user("hello")) == cl100k.count_message(Message.user("hello"))
    gpt4o = TiktokenCounter(model="gpt-4o")
    assert gpt4o.name == "tiktoken/o200k_base"  # GPT-4o's rule keeps the old name
    assert image_cost(gpt4o, image(data_uri(png(1024, 1024)))) == 765
    nano = TiktokenCounter(model="gpt-4.1-nano")
    assert nano.name == "tiktoken/o200k_base/images=patches-2.46"
    assert image_cost(nano, image(data_uri(png(1800, 2400)))) == 3572  # ceil(1452 * 2.46)


def test_default_counter_keeps_its_name_and_counts(cl100k: TiktokenCounter) -> None:
    assert cl100k.name == "tiktoken/cl100k_base"
    assert cl100k.image_rule == "tiles-85-170"
    assert TiktokenCounter(model="gpt-4").name == "tiktoken/cl100k_base"
    assert TiktokenCounter("cl100k_base", images="tiles-85-170") == cl100k


@pytest.mark.parametrize("spec", ["tiles-2833-5667", "patches-1.62", "patches-2.46", "tiles-1-1",
                                  "patches-1.1234567", "patches-0.000001", "patches-3",
                                  "patches-0.0000001"])
def test_image_rule_names_round_trip(cl100k: TiktokenCounter, spec: str) -> None:
    c = TiktokenCounter("cl100k_base", images=spec)
    assert c.name == f"tiktoken/cl100k_base/images={spec}"
    assert c != cl100k
    rebuilt = counter_from_name(c.name)
    assert rebuilt == c and rebuilt.image_rule == spec
    clone = pickle.loads(pickle.dumps(c))
    assert clone == c and clone.image_rule == spec
    part = image(data_uri(png(1800, 2400)))
    assert image_cost(rebuilt, part) == image_cost(c, part) == image_cost(clone, part)


def test_counter_from_name_normalises_the_image_rule() -> None:
    assert counter_from_name("tiktoken/cl100k_base/images=tiles-85-170").name == (
        "tiktoken/cl100k_base")
    assert counter_from_name("tiktoken/cl100k_base/images=patches-1.620").name == (
        "tiktoken/cl100k_base/images=patches-1.62")


@pytest.mark.parametrize(
    "name",
    [
        "tiktoken/cl100k_base/",
        "tiktoken/cl100k_base/images=",
        "tiktoken/cl100k_base/pixels=tiles-1-2",
        "tiktoken/cl100k_base/images=tiles-0-170",
        "tiktoken/cl100k_base/images=tiles-85",
        "tiktoken/cl100k_base/images=patches-0",
        "tiktoken/cl100k_base/images=patches--1",
        "tiktoken/cl100k_base/images=squares-85-170",
        "tiktoken/cl100k_base/images=tiles-85-170/extra",
        "tiktoken//images=tiles-85-170",
    ],
)
def test_bad_image_rule_names(name: str) -> None:
    with pytest.raises(ConfigurationError):
        counter_from_name(name)


def test_images_and_model_are_exclusive() -> None:
    with pytest.raises(ConfigurationError, match="images= or model="):
        TiktokenCounter(model="gpt-4", images="tiles-85-170")
    with pytest.raises(ConfigurationError, match="rule name"):
        TiktokenCounter("cl100k_base", images=2833)  # type: ignore[arg-type]


def test_a_size_is_read_from_a_bounded_prefix_of_the_image(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Every count priced an image by decoding its whole payload and walking every JPEG
    segment: a crafted 48 MB JPEG of empty segments took 4 s per count. The size is read
    from the first 256 KiB and a bounded number of segments; an image whose size is
    not found there is priced as one of unknown size (the rule's maximum)."""
    import base64
    import struct

    decoded: list[int] = []
    original = base64.b64decode

    def spy(data: Any, *args: Any, **kwargs: Any) -> bytes:
        decoded.append(len(data))
        return original(data, *args, **kwargs)

    monkeypatch.setattr(base64, "b64decode", spy)
    counter = ApproxCounter()
    small = counter.count_message(Message(role="user", content=[image(data_uri(jpeg(1024, 768)))]))
    # a real JPEG with a large EXIF block (64 KiB segments) before its frame: found
    exif = (b"\xff\xe1" + struct.pack(">H", 65_535) + b"\0" * 65_533) * 3
    frame = jpeg(1024, 768)
    with_exif = frame[:2] + exif + frame[2:] + b"\0" * 5_000_000  # and a large scan
    assert counter.count_message(Message(role="user", content=[
        image(data_uri(with_exif, "image/jpeg"))])) == small
    # the size after millions of empty segments, or past the prefix: priced as unknown
    empty_segments = frame[:2] + b"\xff\xe0\x00\x02" * 2_000_000 + frame[2:]
    unknown = counter.count_message(Message(role="user", content=[image("https://x/y.jpg")]))
    assert counter.count_message(Message(role="user", content=[
        image(data_uri(empty_segments, "image/jpeg"))])) == unknown
    assert max(decoded) <= 4 * (256 * 1024 // 3)


def test_a_model_of_the_image_table_that_tiktoken_does_not_know_uses_o200k(
    cl100k: TiktokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """computer-use-preview is in the docs and the image table, but tiktoken 0.12 does not
    know it, so TiktokenCounter(model=...) refused it. Every model of the table uses
    o200k_base; a model outside it that tiktoken does not know is still refused."""
    from memstore.tokens import _loading

    monkeypatch.setattr("memstore.tokens._openai._load_encoding", lambda name: cl100k.encoding)

    def unknown(model: str) -> str:
        if model in ("computer-use-preview", "computer-use-preview-2025-03-11",
                     "mystery-model"):
            raise ConfigurationError(f"tiktoken does not know {model!r}")
        return str(_loading._encoding_name_for_model(model))

    monkeypatch.setattr("memstore.tokens._openai._encoding_name_for_model", unknown)
    for model in ("computer-use-preview", "computer-use-preview-2025-03-11"):
        counter = TiktokenCounter(model=model)
        assert counter.name == "tiktoken/o200k_base/images=tiles-65-129"
        assert counter_from_name(counter.name).name == counter.name
    with pytest.raises(ConfigurationError, match="mystery-model"):
        TiktokenCounter(model="mystery-model")


@pytest.mark.parametrize("spec", ["patches-1." + "0" * 70 + "1", "patches-1.0000000000001",
                                  "patches-" + "9" * 13])
def test_a_multiplier_with_too_many_digits_is_refused(spec: str) -> None:
    """patches-1.000...001 was named by a rounded value, "patches-1": the name of another
    counter (equal names must count alike)."""
    with pytest.raises(ConfigurationError, match="at most 12 digits"):
        _images.image_rule_from_spec(spec)
    with pytest.raises(ConfigurationError):
        TiktokenCounter(images=spec)
    assert _images.image_rule_from_spec("patches-1.000000000001").spec == "patches-1.000000000001"
