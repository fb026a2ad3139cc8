#!/usr/bin/env bash
# Build the documentation site (docs/, Sphinx + Furo + MyST) with warnings as errors, and run
# its examples. The site lands in docs/_build/html (open docs/_build/html/index.html).
#   scripts/docs.sh            build + examples + internal links (what CI runs)
#   scripts/docs.sh --serve    build, then serve it on http://127.0.0.1:8001/
source "$(dirname "$0")/_common.sh"
ensure_venv docs
PY="$VENV/bin/python"
OUT="$ROOT/docs/_build/html"

say "building the docs (warnings are errors)"
t0=$SECONDS
rm -rf "$ROOT/docs/_build"
"$PY" -m sphinx -W --keep-going -q -b html "$ROOT/docs" "$OUT"
say "built in $((SECONDS - t0)) s: $OUT/index.html"

say "checking internal links and anchors of the built site"
"$PY" "$ROOT/docs/_ext/check_links.py" "$OUT"

say "running the examples the pages show (tests/docs_examples)"
"$PY" -m pytest -q -p no:cacheprovider tests/docs_examples tests/test_docs.py

if [ "${1:-}" = "--serve" ]; then
  say "serving on http://127.0.0.1:8001/ (Ctrl-C to stop)"
  "$PY" -m http.server 8001 --bind 127.0.0.1 --directory "$OUT"
fi
