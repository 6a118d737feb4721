#!/usr/bin/env bash
# The test command: set up everything from the project's own files, lint, type-check, check the import
# contracts (pyproject.toml), build the docs site strictly, run the suite.
# Includes the real SGLang CPU harness (its own cached venv) and promtool (Debian package prometheus,
# installed with apt-get when missing) for the alert rules; the same package's prometheus server scrapes
# a traced server with exemplar storage in tests/obs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/progress.sh
. scripts/progress.sh
bash scripts/setup.sh
if ! command -v promtool >/dev/null 2>&1; then
  progress_step "test: installing promtool (Debian package prometheus, apt-get)" \
    bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null'
fi
# The run store's tests start a throwaway PostgreSQL cluster (initdb, pg_ctl) and drive the run viewer in
# Debian's chromium through Playwright: both from apt-get when missing.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
  progress_step "test: installing postgresql and chromium (Debian packages, apt-get)" \
    bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql chromium >/dev/null'
fi
bash scripts/sglang-cpu.sh venv
bash scripts/sglang-router.sh venv  # SGLang's router from PyPI in its own venv (tests/router)
.venv/bin/ruff check .
.venv/bin/mypy ssr_server ssr_lab
.venv/bin/lint-imports --no-cache
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
