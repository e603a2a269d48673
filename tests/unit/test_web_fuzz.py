"""Hostile and malformed reviews against both endpoints.

Whatever arrives: never a 5xx, always a JSON body; a 200 is an AdmissionReview that
echoes the request's uid; and hostile *input* is never mistaken for an internal error
(``resize_preemption_errors{where="internal"}`` and ``{where="web"}`` stay at zero) - those counters
must mean "a bug", or nobody can alert on them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from flask import Flask
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.web_fixtures import fit_to_node_objects, review, walkthrough_review
from webhook.base.metrics import Metrics
from webhook.base.settings import Config, Mode
from webhook.web.app import create_app

ENDPOINTS = st.sampled_from(["/validate-resize", "/mutate-resize"])

# One app per mode for the whole module: building an engine per example would dominate
# the run time, and the properties hold whatever the ledger already holds.
_OBJECTS = fit_to_node_objects(annotated=True)
_VIEW = StaticClusterView.from_objects(_OBJECTS)
_MODES: tuple[Mode, ...] = ("enforce", "warn", "deny-infeasible")
METRICS: dict[str, Metrics] = {mode: Metrics() for mode in _MODES}
APPS: dict[str, Flask] = {
    mode: create_app(
        Config(mode=mode), cluster=_VIEW, ledger=InMemoryLedger(), metrics=METRICS[mode]
    )
    for mode in _MODES
}
MODES = st.sampled_from(sorted(APPS))

# -- values ----------------------------------------------------------------------------------

HUGE = st.sampled_from(
    [
        2**64,
        -(2**63) - 1,
        10**30,
        1.5e308,
        -1e-320,
        0,
        -1,
    ]
)
QUANTITY_TEXT = st.sampled_from(
    [
        "",
        "-1",
        "1e999",
        "9" * 400,
        "1Ei",
        "999999999999Ei",
        "0.0000000001",
        "1.5.5",
        "1m1",
        "abc",
        "NaN",
        "Infinity",
        "+1",
        "1 ",
        " 1",
        "0x10",
        "1_000",
        "١٢",  # Arabic-Indic digits: str.isdigit() says yes
        "1e-999",
        "1E3",
        "1e3m",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    HUGE,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    QUANTITY_TEXT,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=12), children, max_size=4),
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (dict keys and list indexes)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutated(doc: Any, path: tuple[Any, ...], replacement: Any, delete: bool) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return doc


def _base_reviews() -> list[dict[str, Any]]:
    _, _, _, high = _OBJECTS
    grown = copy.deepcopy(high)
    grown["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "7", "memory": "1Gi"},
        "limits": {"cpu": "7", "memory": "1Gi"},
    }
    return [walkthrough_review(), review(high, grown), review(high, high)]


BASES = _base_reviews()


@st.composite
def mutated_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """A realistic pods/resize review with one to three fields replaced or removed."""
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:  # every top-level field deleted already
            break
        path = draw(st.sampled_from(paths))
        doc = _mutated(doc, path, draw(JSON_VALUES), delete=draw(st.booleans()))
    return doc


def _encode(doc: Any) -> bytes:
    # The stdlib encoder: it writes integers beyond 64 bits, which orjson refuses to.
    return json.dumps(doc).encode()


def _deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


BODIES = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    JSON_VALUES.map(_encode),
    mutated_reviews().map(_encode),
    st.builds(_deep, st.integers(1, 3000), st.sampled_from(["list", "dict"])),
    # A review whose request is deeply nested in one field.
    st.integers(10, 2000).map(
        lambda d: _encode(walkthrough_review())[:-2] + b',"extra":' + _deep(d, "list") + b"}}"
    ),
)


def _uid_of(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
        uid = doc["request"]["uid"]
    except Exception:
        return None
    return uid if isinstance(uid, str) else None


def _check(app: Flask, endpoint: str, body: bytes, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    resp = app.test_client().post(endpoint, data=body, headers=headers)

    assert resp.status_code < 500, resp.data
    assert resp.mimetype == "application/json"
    payload = orjson.loads(resp.data)
    if resp.status_code == 200:
        assert payload["kind"] == "AdmissionReview"
        answer = payload["response"]
        assert _uid_of(body) == answer["uid"]
        assert isinstance(answer["allowed"], bool)
        for w in answer.get("warnings", ()):
            assert len(w) <= 120 and "\n" not in w
        if endpoint == "/validate-resize":
            assert "patch" not in answer
    else:
        assert resp.status_code in (400, 413, 415)
        assert isinstance(payload["error"], str) and payload["error"]


def _bugs(mode: str) -> float:
    registry = METRICS[mode].registry
    return sum(
        registry.get_sample_value("resize_preemption_errors_total", {"where": where}) or 0.0
        for where in ("internal", "web")
    )


FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(mode=MODES, endpoint=ENDPOINTS, body=BODIES)
def test_arbitrary_bodies_never_5xx(mode: str, endpoint: str, body: bytes) -> None:
    app = APPS[mode]
    before = _bugs(mode)
    _check(app, endpoint, body, "application/json")
    assert before == _bugs(mode)


@FUZZ
@given(mode=MODES, endpoint=ENDPOINTS, doc=mutated_reviews())
def test_hostile_reviews_are_answered_or_refused(
    mode: str, endpoint: str, doc: dict[str, Any]
) -> None:
    app = APPS[mode]
    before = _bugs(mode)
    _check(app, endpoint, _encode(doc), "application/json")
    assert before == _bugs(mode)


@settings(max_examples=100, deadline=None)
@given(
    endpoint=ENDPOINTS,
    content_type=st.one_of(
        st.none(),
        st.sampled_from(["text/plain", "application/json", "application/xml", "*/*"]),
        st.text(max_size=30).filter(lambda t: "\n" not in t and "\r" not in t),
    ),
)
def test_any_content_type(endpoint: str, content_type: str | None) -> None:
    try:
        content_type and content_type.encode("latin-1")
    except UnicodeEncodeError:
        assume(False)
    _check(APPS["enforce"], endpoint, _encode(walkthrough_review()), content_type)
