"""Text that is safe to print: what a crafted file names can never break a line, send a
terminal escape, or fail to encode."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every non-printable character (controls, newlines, lone surrogates,
    format characters) written as a Python escape (``\\n`` as ``\\x0a``, U+D800 as ``\\ud800``),
    so it stays on one line and cannot drive a terminal. Printable text comes back as it is."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000
                       else f"\\U{o:08x}")
    return "".join(out)
