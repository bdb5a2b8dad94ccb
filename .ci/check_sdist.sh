#!/usr/bin/env bash
# Checks that the source distribution is complete: builds it, unpacks it in a
# temporary directory, checks that it holds every tracked file the tests, docs
# and examples need, installs it with the test extra into a fresh virtual
# environment, collects the whole test suite there (every conftest and test
# module imports) and runs the tests that read files from the tree: the docs,
# examples and README, the rendered display page, the Equinox files in
# tests/serialisation/data. About a minute beyond the installation.
#
#   .ci/check_sdist.sh                 # the check above
#   .ci/check_sdist.sh tests filterax  # run these pytest arguments instead
#
# PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "sdist: building"
"$python" -m venv "$work/build-env"
"$work/build-env/bin/pip" install -q build
"$work/build-env/bin/python" -m build --sdist --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
archive=$(ls "$work"/dist/*.tar.gz)
echo "sdist: $(basename "$archive"), $(tar -tzf "$archive" | wc -l) entries"
mkdir "$work/unpacked"
tar -xzf "$archive" -C "$work/unpacked"
source_dir=$(ls -d "$work"/unpacked/*/)

if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  missing=$(
    git -C "$root" ls-files -- conftest.py README.md CHANGELOG.md LICENSE mkdocs.yml \
      pyproject.toml filterax tests docs examples benchmarks |
      while read -r path; do [ -e "$source_dir/$path" ] || echo "$path"; done
  )
  if [ -n "$missing" ]; then
    echo "sdist: these tracked files are missing (see MANIFEST.in):" >&2
    echo "$missing" >&2
    exit 1
  fi
  echo "sdist: every tracked file of the tests, docs and examples is in it"
fi

echo "sdist: installing it with the test extra"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$source_dir[test]"
cd "$source_dir"
if [ $# -gt 0 ]; then
  "$work/venv/bin/python" -m pytest -q -p no:randomly "$@"
else
  echo "sdist: collecting the whole suite"
  "$work/venv/bin/python" -m pytest -q --collect-only >"$work/collect.log" ||
    { tail -40 "$work/collect.log"; exit 1; }
  tail -1 "$work/collect.log"
  echo "sdist: running the tests that read files from the tree"
  "$work/venv/bin/python" -m pytest -q -p no:randomly \
    tests/test_docs.py tests/test_docs_signatures.py tests/test_architecture.py \
    tests/test_display_browser.py tests/serialisation/test_equinox_files.py
fi
echo "sdist: OK"
