"""Number formatting and HTML escaping shared by the report's sections."""

from __future__ import annotations

from html import escape


def esc(text: object) -> str:
    """`text` made safe inside HTML/SVG text and double-quoted attributes."""
    return escape(str(text), quote=True)


def ms(seconds: float) -> str:
    """Seconds as milliseconds with three decimals, e.g. `"1.250 ms"`."""
    return f"{seconds * 1e3:,.3f} ms"


def size(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the value >= 1, e.g. `"2.50 MiB"`."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.2f} {unit}"
    return f"{nbytes:,.0f} B"


def num(value: float) -> str:
    """A coordinate for SVG: short, no exponent."""
    return f"{value:.1f}".rstrip("0").rstrip(".")
