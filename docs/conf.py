"""Sphinx configuration for the django-rmq-retry documentation.

Built by ``scripts/docs.sh`` with warnings as errors. Pages are Markdown (MyST); the
reference pages are generated at build time from the code itself (``_ext/rmq_reference.py``)
so they cannot drift from what the package does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE / "_ext")]

# autodoc imports our modules, and they need a configured Django.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "docs_settings")
import django  # noqa: E402

django.setup()

import django_rmq_retry  # noqa: E402

project = "django-rmq-retry"
author = "django-rmq-retry developers"
copyright = "django-rmq-retry developers"
release = django_rmq_retry.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "rmq_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "reference/_generated"]
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"
html_title = f"django-rmq-retry {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
