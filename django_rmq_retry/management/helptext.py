"""Help texts that show the value an option takes when it is not given, as this project's
settings make it now (``--help`` printed ``(default: PREFETCH)``: a name, not an answer).

Read when the command's parser is built (``manage.py help ...`` or a run), never at import.
"""

from __future__ import annotations

from typing import Any

from ..conf import DEFAULTS, app_settings


def setting_value(key: str) -> Any:
    """``RMQ_RETRY[key]`` as the project sets it (the shipped default when the settings
    cannot be read: help must print even then)."""
    try:
        return getattr(app_settings, key)
    except Exception:  # a broken RMQ_RETRY: the checks report it, help still prints
        return DEFAULTS[key]


def from_setting(key: str, unit: str = "", *, none: str = "off") -> str:
    """``(default: 20, RMQ_RETRY['PREFETCH'])``: the effective value and where it comes from."""
    value = setting_value(key)
    if value is None or value == "":
        shown = none
    elif isinstance(value, int | float) and not isinstance(value, bool):
        shown = f"{value:,g}{unit}"
    else:
        shown = f"{value}{unit}"
    return f"(default: {shown}, RMQ_RETRY['{key}'])"
