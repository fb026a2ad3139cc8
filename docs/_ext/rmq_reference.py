"""Reference pages written from the code at build time, so they cannot drift from it.

Sphinx calls :func:`generate` before it reads any page; it writes Markdown fragments into
``docs/reference/_generated/`` (not committed), which the reference pages include:

* ``settings.md``: every key of ``conf.DEFAULTS`` with its default and the comment written
  above it in ``conf.py`` (the comment *is* the documentation of a setting);
* ``commands.md``: every management command's ``--help``, as argparse prints it;
* ``headers.md``: every header we own (``core.names.OUR_HEADERS``);
* ``asyncapi.md``: the AsyncAPI document ``manage.py rmq_asyncapi`` prints for the demo
  project's receivers.

Check ids are documented by hand (their meaning needs prose) and a test
(``tests/test_docs.py``) fails when the code has one the reference does not name; so does a
header the code names that ``OUR_HEADERS`` lacks.
"""

from __future__ import annotations

import ast
import io
import pkgutil
import pprint
import tokenize
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
OUT = DOCS / "reference" / "_generated"


def setting_comments(source: str) -> dict[str, str]:
    """The comment lines written directly above each key of the ``DEFAULTS`` dict."""
    tree = ast.parse(source)
    defaults = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and any(
            isinstance(t, ast.Name) and t.id == "DEFAULTS"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    )
    assert isinstance(defaults, ast.Dict)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    found: dict[str, str] = {}
    previous: tuple[int, str] | None = None  # (last line of the previous item, its comment)
    for key, value in zip(defaults.keys, defaults.values, strict=True):
        if not isinstance(key, ast.Constant):
            continue
        line = key.lineno - 1
        lines: list[str] = []
        while line in comments:
            lines.insert(0, comments[line])
            line -= 1
        text = " ".join(lines)
        if not text and previous and previous[0] == key.lineno - 1:
            text = previous[1]  # keys written as a group share the comment above the first
        found[str(key.value)] = text
        previous = (value.end_lineno or key.lineno, text)
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_md() -> str:
    from django_rmq_retry import conf

    comments = setting_comments(Path(conf.__file__).read_text())
    parts: list[str] = []
    for key, default in conf.DEFAULTS.items():
        shown = pprint.pformat(default, width=88, sort_dicts=False)
        parts.append(f"## `{key}`\n\n{comments.get(key, '')}\n\n```python\n{key!r}: {shown}\n```\n")
    return "\n".join(parts)


def commands_md() -> str:
    from django.core.management import load_command_class

    import django_rmq_retry.management.commands as package

    parts: list[str] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("rmq_"):
            continue
        command = load_command_class("django_rmq_retry", info.name)
        parser = command.create_parser("manage.py", info.name)
        text = parser.format_help().rstrip()
        parts.append(f"## `{info.name}`\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


def headers_md() -> str:
    from django_rmq_retry.core.names import OUR_HEADERS

    rows = ["| header (default prefix) | what it carries |", "| --- | --- |"]
    for suffix, text in OUR_HEADERS.items():
        rows.append(f"| `rmq_retry-{suffix}` | {_cell(text)} |")
    return "\n".join(rows) + "\n"


def asyncapi_md() -> str:
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command("rmq_asyncapi", stdout=out)
    document = json.loads(out.getvalue())
    return "```json\n" + json.dumps(document, indent=2) + "\n```\n"


def generate(app: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pages = {"settings.md": settings_md, "commands.md": commands_md, "headers.md": headers_md}
    try:
        from django_rmq_retry.management.commands import rmq_asyncapi  # noqa: F401
    except ImportError:
        pass
    else:
        pages["asyncapi.md"] = asyncapi_md
    for name, build in pages.items():
        text = build()
        path = OUT / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
