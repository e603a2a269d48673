"""Kubernetes quantities parse exactly, round up like apimachinery, and fail clearly."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.core import resources
from webhook.core.errors import InputError, QuantityError
from webhook.core.resources import (
    Resources,
    cpu_millis,
    format_amount,
    format_cpu,
    format_memory,
    memory_bytes,
    parse_quantity,
    total,
)

Ki, Mi, Gi, Ti, Pi, Ei = (2**10 * 1024**k for k in range(6))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("100m", 100, id="millicores"),
        pytest.param("1.5", 1500, id="decimal-fraction"),
        pytest.param("2", 2000, id="whole-cores"),
        pytest.param(2, 2000, id="json-integer"),
        pytest.param("0.1", 100, id="tenth-of-a-core"),
        pytest.param(".5", 500, id="leading-dot"),
        pytest.param("1.", 1000, id="trailing-dot"),
        pytest.param("+1", 1000, id="explicit-plus-sign"),
        pytest.param("1e3", 1_000_000, id="decimal-exponent"),
        pytest.param("1E3", 1_000_000, id="upper-case-exponent"),
        pytest.param("25e-3", 25, id="negative-exponent"),
        pytest.param("1k", 1_000_000, id="kilo-suffix"),
        pytest.param("0", 0, id="zero"),
        pytest.param("0.0001", 1, id="sub-millicore-rounds-up"),
        pytest.param("1n", 1, id="one-nanocore-rounds-up"),
        pytest.param("1500u", 2, id="micro-rounds-up"),
        pytest.param("1001m", 1001, id="just-over-a-core"),
        pytest.param(0.5, 500, id="yaml-float"),
        pytest.param(" 250m ", 250, id="surrounding-blanks"),
    ],
)
def test_cpu_in_millicores(text: object, expected: int) -> None:
    assert expected == cpu_millis(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2Gi", 2 * Gi, id="gibibytes"),
        pytest.param("500M", 500_000_000, id="decimal-megabytes"),
        pytest.param("524288Ki", 512 * Mi, id="kibibytes-equal-512Mi"),
        pytest.param("1.5Gi", 1536 * Mi, id="fractional-binary"),
        pytest.param("0.5Ki", 512, id="half-a-kibibyte"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1E", 10**18, id="exa-suffix-not-exponent"),
        pytest.param("1Ei", Ei, id="exbibyte"),
        pytest.param("3Ti", 3 * Ti, id="tebibytes"),
        pytest.param("2Pi", 2 * Pi, id="pebibytes"),
        pytest.param("100m", 1, id="milli-byte-rounds-up"),
        pytest.param("1e-3", 1, id="fraction-of-a-byte-rounds-up"),
        pytest.param("1.0000000001", 2, id="barely-over-rounds-up"),
        pytest.param(
            "123456789012345678901234567890",
            123456789012345678901234567890,
            id="very-large-integer-stays-exact",
        ),
        pytest.param(10**30, 10**30, id="very-large-json-integer"),
        pytest.param("99999999999999999999Ei", 99999999999999999999 * Ei, id="huge-binary"),
    ],
)
def test_memory_in_bytes(text: object, expected: int) -> None:
    assert expected == memory_bytes(text)


def test_parse_keeps_the_exact_decimal() -> None:
    assert Decimal("0.1") == parse_quantity("100m")
    assert Decimal(1536 * Mi) == parse_quantity("1.5Gi")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("abc", "not a valid quantity", id="letters"),
        pytest.param("", "not a valid quantity", id="empty"),
        pytest.param("Gi", "no digits", id="suffix-only"),
        pytest.param(".", "no digits", id="lone-dot"),
        pytest.param("1.2.3", "unknown suffix", id="two-dots"),
        pytest.param("1K", "unknown suffix", id="upper-case-kilo"),
        pytest.param("1 Gi", "unknown suffix", id="blank-before-suffix"),
        pytest.param("1e", "unknown suffix", id="exponent-without-digits"),
        pytest.param("1e999", "out of range", id="exponent-out-of-range"),
        pytest.param("-1", "negative", id="negative"),
        pytest.param("-100m", "negative", id="negative-millis"),
        pytest.param(True, "is not a quantity", id="boolean"),
        pytest.param(None, "expected a string", id="null"),
        pytest.param(["1"], "expected a string", id="list"),
        pytest.param(float("nan"), "expected a string", id="nan"),
        pytest.param("1" * 101, "too long", id="too-long"),
    ],
)
def test_bad_quantities_name_value_and_field(text: object, fragment: str) -> None:
    with pytest.raises(QuantityError) as raised:
        cpu_millis(text, where="node-1 allocatable.cpu")

    message = str(raised.value)
    assert message.startswith("node-1 allocatable.cpu: ")
    assert fragment in message
    if isinstance(text, str) and text and len(text) < 100:
        assert repr(text) in message


def test_quantity_errors_are_input_errors() -> None:
    with pytest.raises(InputError):
        memory_bytes("lots", where="pod default/a.spec.containers[0].resources.requests.memory")


@pytest.mark.parametrize(
    ("millis", "expected"),
    [
        pytest.param(6000, "6", id="whole"),
        pytest.param(1500, "1500m", id="fraction"),
        pytest.param(0, "0", id="zero"),
        pytest.param(1, "1m", id="one-millicore"),
    ],
)
def test_format_cpu(millis: int, expected: str) -> None:
    assert expected == format_cpu(millis)


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        pytest.param(Gi, "1Gi", id="gibibyte"),
        pytest.param(512 * Mi, "512Mi", id="mebibytes"),
        pytest.param(1536 * Mi, "1536Mi", id="not-whole-gibibytes"),
        pytest.param(Ki, "1Ki", id="kibibyte"),
        pytest.param(1000, "1000", id="plain-bytes"),
        pytest.param(0, "0", id="zero"),
        pytest.param(3 * Ei, "3Ei", id="exbibytes"),
    ],
)
def test_format_memory(amount: int, expected: str) -> None:
    assert expected == format_memory(amount)


@pytest.mark.parametrize("text", ["100m", "6", "1500m", "0"])
def test_cpu_formats_round_trip(text: str) -> None:
    assert text == format_cpu(cpu_millis(text))


@pytest.mark.parametrize("text", ["1Gi", "512Mi", "1536Mi", "7Ki", "1000", "2Ti"])
def test_memory_formats_round_trip(text: str) -> None:
    assert text == format_memory(memory_bytes(text))


def test_format_amount_handles_negative_values() -> None:
    assert "-1500m" == format_amount("cpu", -1500)
    assert "-1Gi" == format_amount("memory", -Gi)


def test_resources_arithmetic() -> None:
    a, b = Resources(1000, 2 * Gi), Resources(1500, Gi)

    assert Resources(2500, 3 * Gi) == a + b
    assert Resources(-500, Gi) == a - b
    assert Resources(1500, 2 * Gi) == a.max(b)
    assert Resources(0, Gi) == (a - b).clamp()
    assert ("cpu",) == b.exceeds_in(a)
    assert b.fits_in(Resources(1500, Gi))
    assert not b.fits_in(Resources(1499, 10 * Gi))
    assert Resources(4000, 3 * Gi) == total([a, b, Resources(1500, 0)])
    assert "cpu 1, memory 2Gi" == a.describe()
    assert Resources(7, 2 * Gi) == a.replace("cpu", 7)
    assert Resources().is_zero()
    assert ("cpu", "memory") == Resources(2000, 1).exceeds_in(Resources(1000, 0))


def test_resources_is_a_value_not_a_tuple() -> None:
    # "Less" between two amounts is fits_in's question; a tuple's order would answer it
    # element by element.
    assert (1000, 0) != Resources(1000, 0)
    with pytest.raises(TypeError):
        Resources(1000, 0) < Resources(2000, 0)  # type: ignore[operator]  # noqa: B015
    with pytest.raises(AttributeError):
        Resources().cpu = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        pytest.param(cpu_millis, "2x", id="cpu-unknown-suffix"),
        pytest.param(cpu_millis, "-1", id="cpu-negative"),
        pytest.param(memory_bytes, "lots", id="memory-no-digits"),
        pytest.param(memory_bytes, "-1Gi", id="memory-negative"),
    ],
)
def test_a_remembered_invalid_text_still_names_the_field_each_time(
    parse: Callable[..., int], text: str
) -> None:
    for where in ("pod a/b.requests.cpu", "node n allocatable"):
        with pytest.raises(QuantityError, match=re.escape(where)):
            parse(text, where=where)


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", "m", "Ki", "Mi", "k"]))
def test_remembered_results_equal_a_fresh_parse(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    assert resources._cpu_millis(text, "cpu") == cpu_millis(text) == cpu_millis(text)
    assert resources._memory_bytes(text, "memory") == memory_bytes(text) == memory_bytes(text)


# -- against the Kubernetes client's parse_quantity ------------------------------------
# The core cannot use kubernetes.utils.parse_quantity (see webhook/core/resources.py); on
# what both accept and the client computes exactly, the two must agree.

SUFFIXES = ("", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


@st.composite
def valid_quantities(draw: st.DrawFn) -> str:
    """Quantities of apimachinery's grammar, short enough that the client's Decimal
    arithmetic (28 significant digits) stays exact."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.text("0123456789", max_size=4))
    fraction = draw(st.one_of(st.none(), st.text("0123456789", max_size=4)))
    if not whole and not fraction:
        whole = "0"
    number = whole if fraction is None else f"{whole}.{fraction}"
    suffix = draw(
        st.one_of(
            st.sampled_from(SUFFIXES),
            st.builds(
                "{}{}{}".format,
                st.sampled_from("eE"),
                st.sampled_from(["", "+", "-"]),
                st.integers(0, 9).map(str),
            ),
        )
    )
    return f"{sign}{number}{suffix}"


@given(valid_quantities())
def test_parse_quantity_agrees_with_the_kubernetes_client(text: str) -> None:
    from kubernetes.utils import parse_quantity as client_parse_quantity

    assert client_parse_quantity(text) == parse_quantity(text)


@given(valid_quantities().filter(lambda t: not t.startswith("-")))
def test_millicores_and_bytes_are_the_clients_value_rounded_up(text: str) -> None:
    from kubernetes.utils import parse_quantity as client_parse_quantity

    value = client_parse_quantity(text)

    assert math.ceil(value * 1000) == cpu_millis(text)
    assert math.ceil(value) == memory_bytes(text)
