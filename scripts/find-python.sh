#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter, or explain on stderr what to install and exit 1.
# Preference: $PYTHON if set; then 3.12 (the version constraints.txt was locked on), then newer ones;
# each first on PATH, then among pyenv's installed versions (pyenv may hold 3.12 without activating it,
# so a bare `python3.12` can fail while the interpreter exists); last a plain `python3`.
set -u
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
root=${PYENV_ROOT:-$HOME/.pyenv}
cands=(${PYTHON:-})
for minor in 12 13 14 15; do
  cands+=(python3.$minor $(ls -d "$root"/versions/3.$minor.*/bin/python3 2>/dev/null | sort -rV))
done
cands+=(python3)
for cand in "${cands[@]}"; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
echo "error: no Python >= 3.12 found (tried \$PYTHON, python3.12..python3.15, $root/versions/3.1x, python3);" \
     "install one (e.g. 'apt-get install python3.12' or 'pyenv install 3.12') or run 'make PYTHON=/path/to/python3.12'" >&2
exit 1
