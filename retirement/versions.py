"""Engine versions, compared only as far as their release numbers say.

A version is ``[v]MAJOR.MINOR.PATCH`` with an optional suffix.  A post-release
(``.post1``) is at least its release; a pre-release (``rc1``, ``a1``, ``b1``, ``.dev1``)
is below it; anything else (no version, a build of a branch) reads as unknown, and a
rule that needs a version then keeps to what holds without it.
"""

from __future__ import annotations

import re

_VERSION = re.compile(r"^v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})(.*)$")
_POST = re.compile(r"^(\.post\d+)?(\+[0-9A-Za-z.]+)?$")
_PRE = re.compile(r"^(\.?(rc|a|b|dev)\d*)(\+[0-9A-Za-z.]+)?$")


def at_least(version: str, minimum: tuple[int, int, int]) -> bool:
    """Whether ``version`` is known to be ``minimum`` or later."""
    m = _VERSION.fullmatch(version.strip())
    if m is None:
        return False
    release = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    suffix = m.group(4)
    if _POST.fullmatch(suffix):
        return release >= minimum
    if _PRE.fullmatch(suffix):
        return release > minimum
    return False
