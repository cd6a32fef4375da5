"""JSON Schema string formats, as anchored regexes in the subset
:mod:`.regex` compiles.

Every regex uses explicit ASCII classes, so Python's ``re`` reads it the same
way (the enum filter in :mod:`.json_schema` relies on that). Each describes
a subset of the format that is valid by the format's RFC and by the checks
common validators run:

* ``date``, ``time``, ``date-time``: RFC 3339 with years 0001-9999, real
  month lengths and leap years, no leap seconds, upper-case ``T`` and ``Z``,
  at most 9 fraction digits;
* ``duration``: RFC 3339 appendix A (ISO 8601), at most 9 digits per field;
* ``uuid``: the 8-4-4-4-12 hex form;
* ``ipv4``: dotted quad without leading zeros; ``ipv6``: RFC 4291 text
  forms, with ``::`` and embedded IPv4;
* ``hostname``: RFC 1123 labels, at most 8 labels of at most 30 characters
  (so the name stays under the 253-character limit);
* ``email``: ``dot-atom@hostname``;
* ``uri``: RFC 3986 absolute URI (IP literals limited to IPv6).
"""

from __future__ import annotations

__all__ = ["FORMATS"]


def _group(*options: str) -> str:
    return "(?:" + "|".join(options) + ")"


_D = "[0-9]"
_YEAR = _group(f"{_D}{{3}}[1-9]", f"{_D}{{2}}[1-9]{_D}", f"{_D}[1-9]{_D}{{2}}", f"[1-9]{_D}{{3}}")
_LEAP_YEAR = _group(
    f"{_D}{{2}}" + _group("0[48]", "[2468][048]", "[13579][26]"),
    _group("0[48]", "[2468][048]", "[13579][26]") + "00",
)
_MONTH_DAY = _group(
    "(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    "02-(?:0[1-9]|1[0-9]|2[0-8])",
)
_DATE = _group(f"{_YEAR}-{_MONTH_DAY}", f"{_LEAP_YEAR}-02-29")
_HOUR = "(?:[01][0-9]|2[0-3])"
_MIN = "[0-5][0-9]"
_TIME = f"{_HOUR}:{_MIN}:{_MIN}(?:\\.{_D}{{1,9}})?" + _group("Z", f"[+-]{_HOUR}:{_MIN}")

_N = f"{_D}{{1,9}}"
_DUR_TIME = "T" + _group(f"{_N}H(?:{_N}M(?:{_N}S)?)?", f"{_N}M(?:{_N}S)?", f"{_N}S")
_DUR_DATE = _group(f"{_N}D", f"{_N}M(?:{_N}D)?", f"{_N}Y(?:{_N}M(?:{_N}D)?)?") + f"(?:{_DUR_TIME})?"
_DURATION = "P" + _group(_DUR_DATE, _DUR_TIME, f"{_N}W")

_HEX = "[0-9a-fA-F]"
_OCTET = _group("25[0-5]", "2[0-4][0-9]", "1[0-9]{2}", "[1-9]?[0-9]")
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    h = f"{_HEX}{{1,4}}"

    def groups(k: int) -> str:
        """Exactly k colon-separated groups (k >= 1)."""
        return h if k == 1 else f"{h}(?::{h}){{{k - 1}}}"

    def up_to(k: int) -> str:
        """Zero to k groups."""
        return "" if k == 0 else f"(?:{h}(?::{h}){{0,{k - 1}}})?"

    forms = [f"(?:{h}:){{7}}{h}", f"(?:{h}:){{6}}{_IPV4}"]
    for left in range(8):  # groups before "::"; "::" stands for at least one
        lead = "" if left == 0 else groups(left)
        forms.append(f"{lead}::{up_to(7 - left)}")
        if left <= 5:
            forms.append(f"{lead}::(?:{h}:){{0,{5 - left}}}{_IPV4}")
    return _group(*forms)


_IPV6 = _ipv6()
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"
_HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,7}}"
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = f"{_ATEXT}+(?:\\.{_ATEXT}+)*@{_HOSTNAME}"

_PCT = f"%{_HEX}{{2}}"
_UNRESERVED_SUB = "-A-Za-z0-9._~!$&'()*+,;="
_PCHAR = _group(f"[{_UNRESERVED_SUB}:@]", _PCT)
_SEGMENT = f"{_PCHAR}*"
_AUTHORITY = (
    f"(?:{_group(f'[{_UNRESERVED_SUB}:]', _PCT)}*@)?"
    + _group(f"\\[{_IPV6}\\]", f"{_group(f'[{_UNRESERVED_SUB}]', _PCT)}*")
    + f"(?::{_D}{{0,5}})?"
)
_HIER = _group(
    f"//{_AUTHORITY}(?:/{_SEGMENT})*",
    f"/(?:{_PCHAR}+(?:/{_SEGMENT})*)?",
    f"{_PCHAR}+(?:/{_SEGMENT})*",
    "",
)
_QUERY_CHARS = _group(f"[{_UNRESERVED_SUB}:@/?]", _PCT)
_URI = f"[A-Za-z][A-Za-z0-9+.-]*:{_HIER}(?:\\?{_QUERY_CHARS}*)?(?:#{_QUERY_CHARS}*)?"

#: Format name -> anchored regex.
FORMATS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "duration": f"^{_DURATION}$",
    "uuid": f"^{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}$",
    "email": f"^{_EMAIL}$",
    "ipv4": f"^{_IPV4}$",
    "ipv6": f"^{_IPV6}$",
    "hostname": f"^{_HOSTNAME}$",
    "uri": f"^{_URI}$",
}
