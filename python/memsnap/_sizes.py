"""Byte sizes as the command line reads them (``2GiB``, ``512MB``, ``1.5G``, ``1048576``).

A line-for-line port of ``src/size.rs`` so that the pytest plugin can reject a bad
``@pytest.mark.gpu_memory(max_peak=...)`` at collection time, before any GPU work and without
a snapshot to hand to ``memsnap check``. The plugin still passes the original text to
``memsnap check``, which parses it again; ``python/tests/test_plugin.py`` checks that both
parsers give the same byte counts.

Units are case-insensitive (ASCII only) and may be separated from the number by spaces:

- none or ``B``: bytes;
- ``kB``/``KB``, ``MB``, ``GB``, ``TB``, ``PB``: decimal, powers of 1000;
- ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``: binary, powers of 1024;
- ``K``, ``M``, ``G``, ``T``, ``P`` alone: binary, so ``1.5G`` is 1,610,612,736 bytes.

Fractions are exact (no floating point) and rounded half up to the nearest byte.
"""

from __future__ import annotations

import json

__all__ = ["parse_size", "U64_MAX"]

#: The largest size the command line accepts (Rust's ``u64::MAX``).
U64_MAX: int = (1 << 64) - 1

_MULTIPLIERS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1_000,
    "mb": 1_000_000,
    "gb": 1_000_000_000,
    "tb": 1_000_000_000_000,
    "pb": 1_000_000_000_000_000,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
    "p": 1 << 50,
    "pib": 1 << 50,
}

# Rust's str::to_ascii_lowercase: only A-Z change (str.lower() would also fold, e.g., the
# Kelvin sign U+212A to "k", which the CLI rejects).
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _quoted(text: str) -> str:
    """The text in double quotes, as Rust's ``{:?}`` shows a plain string."""
    return json.dumps(text, ensure_ascii=False)


def parse_size(text: str) -> int:
    """Parse a size the way ``memsnap check --max-peak`` does.

    Raises ``ValueError`` with the CLI's message (``invalid size "2 GiBs": expected ...``)
    when the text is not a size.
    """
    if not isinstance(text, str):
        raise TypeError(f"a size is a str such as '2GiB', not {type(text).__name__}")
    s = text.strip()
    split = len(s)
    for i, c in enumerate(s):
        if not ("0" <= c <= "9" or c == "."):
            split = i
            break
    number, unit = s[:split], s[split:].strip()

    def bad() -> ValueError:
        return ValueError(
            f"invalid size {_quoted(text)}: expected a number of bytes with an optional unit, "
            "e.g. 1073741824, 1GiB, 500MB, 1.5G (K/M/G/T alone are binary)"
        )

    mult = _MULTIPLIERS.get(unit.translate(_ASCII_LOWER))
    if mult is None:
        raise bad()
    whole, _, frac = number.partition(".")
    if (not whole and not frac) or "." in frac or len(whole) > 20 or len(frac) > 18:
        raise bad()
    scale = 10 ** len(frac)
    scaled = int(whole or "0") * scale + int(frac or "0")
    value = (scaled * mult + scale // 2) // scale
    if value > U64_MAX:
        raise ValueError(f"invalid size {_quoted(text)}: larger than {U64_MAX} bytes")
    return value
