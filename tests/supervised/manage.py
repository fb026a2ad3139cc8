#!/usr/bin/env python
"""A project's ``manage.py`` that does something before Django starts, as projects do
(``.env`` loading, django-configurations, ``sys.path`` edits): it appends a line to the file
named by ``RMQ_TEST_ENTRY_LOG`` with its pid and whether the interpreter runs in UTF-8 mode
(``-X utf8``), and puts the repository's root on ``sys.path``. A supervised consumer child
started through this file writes its line too; one started with ``python -m django`` not."""

import os
import sys

if __name__ == "__main__":
    path = os.environ.get("RMQ_TEST_ENTRY_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} utf8={sys.flags.utf8_mode}\n")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
