"""bench.checkpoint reads CRIU's own share of a checkpoint from the archive's
``stats-dump``: two magics, the message's size, then a ``stats_entry`` whose ``dump``
message holds varint fields (2 = the time the process was frozen, in µs)."""

from __future__ import annotations

import pytest

from bench.checkpoint import dump_stats


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def image(fields: dict[int, int]) -> bytes:
    dump = b"".join(varint(number << 3) + varint(value) for number, value in fields.items())
    entry = varint(1 << 3 | 2) + varint(len(dump)) + dump
    return b"\x54\x56\x12\x54" + b"\x82\x44\x10\x57" + len(entry).to_bytes(4, "little") + entry


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({1: 334, 2: 179223, 3: 48467, 4: 32367, 7: 26427},
                     {1: 334, 2: 179223, 3: 48467, 4: 32367, 7: 26427},
                     id="a-100MiB-dump-as-criu-wrote-it"),
        pytest.param({2: 1}, {2: 1}, id="one-byte-varint"),
        pytest.param({2: 12_150_000, 5: 2**40}, {2: 12_150_000, 5: 2**40}, id="many-byte-varints"),
    ],
)  # fmt: skip
def test_dump_stats(fields: dict[int, int], expected: dict[int, int]) -> None:
    assert expected == dump_stats(image(fields))


def test_a_restore_entry_is_not_read_as_a_dump() -> None:
    restore = varint(2 << 3 | 2) + varint(2) + varint(1 << 3) + varint(5)
    data = b"\0" * 8 + len(restore).to_bytes(4, "little") + restore
    assert {} == dump_stats(data)
