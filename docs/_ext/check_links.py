"""Check every internal link and anchor of the built site (Sphinx checks cross-references;
this also catches a raw Markdown or HTML link to a page or an anchor that does not exist).

Usage: python docs/_ext/check_links.py docs/_build/html   (exit 1 and a list when broken)
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(str(values[key]))
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))


def broken_links(site: Path) -> list[str]:
    pages: dict[Path, _Page] = {}
    for path in site.rglob("*.html"):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    broken: list[str] = []
    for path, page in pages.items():
        for href in page.links:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue  # external: not checked (no network in CI)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if target.suffix == ".html" and target not in pages:
                broken.append(f"{path.relative_to(site.resolve())}: {href} (no such page)")
            elif not target.exists():
                broken.append(f"{path.relative_to(site.resolve())}: {href} (no such file)")
            elif parts.fragment and target in pages and parts.fragment not in pages[target].ids:
                broken.append(f"{path.relative_to(site.resolve())}: {href} (no such anchor)")
    return broken


if __name__ == "__main__":
    site = Path(sys.argv[1])
    problems = broken_links(site)
    for line in problems:
        print(f"broken link: {line}")
    print(f"{len(problems)} broken internal link(s) in {site}")
    sys.exit(1 if problems else 0)
