"""Resource versions compared, as KEP-5504 (stable in Kubernetes 1.35) defines them.

A resource version is a decimal integer without leading zeros; of two versions of objects
of the same resource, the greater is the later write. The API server has always issued
them this way (they are etcd revisions); KEP-5504 made the order part of the API. Anything
else is not comparable: callers treat it as "cannot tell", never as older or newer.
"""

from __future__ import annotations

from collections.abc import Iterable


def comparable(version: str) -> bool:
    """Whether ``version`` is a resource version in KEP-5504's form."""
    return version.isdecimal() and version.isascii() and (version == "0" or version[0] != "0")


def at_least(version: str, wanted: str) -> bool | None:
    """Whether ``version`` is ``wanted`` or later; ``None`` when either is not comparable.
    Compared as KEP-5504 says: the longer is the greater, else the digits decide."""
    if not (comparable(version) and comparable(wanted)):
        return None
    return (len(version), version) >= (len(wanted), wanted)


def latest(versions: Iterable[str]) -> str:
    """The greatest comparable version in ``versions``, "" if none is comparable."""
    best = ""
    for v in versions:
        if comparable(v) and (not best or at_least(v, best)):
            best = v
    return best
