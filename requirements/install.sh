#!/usr/bin/env bash
# Installs a lock into a virtual environment: exactly its pins (--no-deps). `make setup` runs it.
#
#   bash requirements/install.sh VENV LOCK
#
# uv installs the lock in about half pip's time on a 2-core machine: it unpacks on every core, where pip uses one (a
# fresh clone's `make test` pays it each time). pip fetches uv, pinned, into VENV/uv (not into
# the environment itself, whose packages are the lock's), and uv is handed pip's own indexes and find-links, read from
# `pip config list` (the PIP_* environment included), because uv reads none of pip's configuration. Where uv cannot
# be had, or fails, pip installs the lock as it always did, and says so.
#
# Not byte-compiled by uv: the environment holds ~35,000 modules and relayrl's processes import ~3,000 of them, so
# compiling all at install cost ~36 s of a 2-core machine's set-up where compiling the imported ones costs ~10 s of
# CPU. Each module compiles on its first import instead: the Makefile unexports PYTHONDONTWRITEBYTECODE (set on these
# machines), so `make demo` and `make test` write the bytecode their imports need into the environment, and later
# processes, `relayrl` run by hand included, read it.
set -euo pipefail
VENV="$1"
LOCK="$2"
PY="$VENV/bin/python"
UV_VERSION=0.13.9
quiet() { grep -v 'is ignored: it is neither' || true; }  # the local wheel mirror warns about every index it skips

pip_sources() {  # pip's index-url, extra-index-url and find-links, as uv's flags
  "$PY" -m pip config list 2>/dev/null | "$PY" -c '
import ast, sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
seen = []
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    for source in ast.literal_eval(value).split() if flag and value else []:
        if (flag, source) not in seen:
            seen.append((flag, source))
print(" ".join(f"{flag} {source}" for flag, source in seen))'
}

with_pip() {
  "$PY" -m pip install -q --upgrade pip 2>&1 | quiet
  "$PY" -m pip install -q --no-deps -r "$LOCK" 2>&1 | quiet
}

UV="$VENV/uv/bin/uv"
if ! [ -x "$UV" ]; then
  "$PY" -m pip install -q --target "$VENV/uv" "uv==$UV_VERSION" >"$VENV/uv.log" 2>&1 || true
fi
if ! [ -x "$UV" ]; then
  echo "install.sh: uv $UV_VERSION could not be fetched (see $VENV/uv.log): pip installs $LOCK"
  with_pip
  exit 0
fi
# shellcheck disable=SC2046  # the sources are words: flag, URL or folder, flag, ...
if ! "$UV" pip install -q --python "$PY" --no-deps --index-strategy unsafe-best-match \
  $(pip_sources) -r "$LOCK" 2>"$VENV/uv.log"; then
  echo "install.sh: uv failed to install $LOCK ($(tail -1 "$VENV/uv.log")): pip installs it"
  with_pip
fi
