"""The hand-written parts of the reference cannot drift from the code: these fail first.

The generated parts (settings, commands, headers, the AsyncAPI page) are written from the code
when the site is built (docs/_ext/rmq_reference.py); what needs prose is checked here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import django_rmq_retry
from django_rmq_retry.conf import DEFAULTS
from django_rmq_retry.core.names import OUR_HEADERS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(django_rmq_retry.__file__).resolve().parent
DOCS = ROOT / "docs"


def _sources() -> str:
    return "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def test_every_check_id_the_code_can_emit_is_documented() -> None:
    source = "\n".join(p.read_text() for p in (PACKAGE / "checks").glob("*.py"))
    errors = {int(n) for n in re.findall(r"_err\(\s*(\d+)\s*,", source)}
    others = set(re.findall(r'ID\}\.([WI]\d{3})"', source))
    ids = {f"django_rmq_retry.E{n:03d}" for n in errors}
    ids |= {f"django_rmq_retry.{n}" for n in others}
    ids |= set(re.findall(r"django_rmq_retry\.[EWI]\d{3}", _sources()))
    page = (DOCS / "reference" / "checks.md").read_text()
    assert len(ids) > 10
    assert sorted(i for i in ids if f"`{i}`" not in page) == []


def test_every_header_the_code_names_is_in_the_table() -> None:
    named = set(re.findall(r"""\b(?:h|header)\(\s*["']([a-z][a-z0-9-]*)["']\s*\)""", _sources()))
    assert "attempt" in named
    assert sorted(named - set(OUR_HEADERS)) == []


def test_every_setting_has_its_comment_in_conf_py() -> None:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from rmq_reference import setting_comments
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    comments = setting_comments((PACKAGE / "conf.py").read_text())
    assert sorted(k for k in DEFAULTS if not comments.get(k)) == []
