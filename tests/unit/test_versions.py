"""Resource versions compared as KEP-5504 defines them (webhook.core.versions)."""

from __future__ import annotations

import pytest

from webhook.core.versions import at_least, comparable, latest


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        pytest.param("0", True, id="zero"),
        pytest.param("12345", True, id="decimal"),
        pytest.param("", False, id="empty"),
        pytest.param("012", False, id="leading-zero"),
        pytest.param("-1", False, id="negative"),
        pytest.param("1e3", False, id="not-decimal"),
        pytest.param("١٢", False, id="non-ascii-digits"),
        pytest.param(" 12", False, id="space"),
    ],
)
def test_only_decimal_integers_without_leading_zeros_are_comparable(
    version: str, expected: bool
) -> None:
    assert expected is comparable(version)


@pytest.mark.parametrize(
    ("version", "wanted", "expected"),
    [
        pytest.param("13", "13", True, id="same"),
        pytest.param("13", "12", True, id="later"),
        pytest.param("12", "13", False, id="earlier"),
        pytest.param("100", "99", True, id="longer-is-later"),
        pytest.param("99", "100", False, id="shorter-is-earlier"),
        pytest.param("", "13", None, id="nothing-yet"),
        pytest.param("13", "x", None, id="not-a-version"),
    ],
)
def test_at_least_orders_by_length_then_digits(
    version: str, wanted: str, expected: bool | None
) -> None:
    assert expected is at_least(version, wanted)


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        pytest.param(["9", "100", "12"], "100", id="greatest"),
        pytest.param(["", "x", "7"], "7", id="others-ignored"),
        pytest.param(["", "x"], "", id="none-comparable"),
        pytest.param([], "", id="none"),
    ],
)
def test_latest_is_the_greatest_comparable_version(versions: list[str], expected: str) -> None:
    assert expected == latest(versions)
