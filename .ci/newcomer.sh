#!/usr/bin/env bash
# The newcomer path, run by CI (.ci/run): what someone who just cloned fsmingle types first.
#
#   bash .ci/newcomer.sh            clone this checkout into a temp dir and run the README's first
#                                   command there, verbatim (it makes its own fresh venv); fail if it fails
#   bash .ci/newcomer.sh --tests    run the README's test command, verbatim, in this checkout
#
# Both commands are extracted from README.md -- the fenced ```bash block after the marker lines
# "<!-- newcomer: first command" and "<!-- newcomer: test command" -- never copied here, so the
# README cannot drift from what CI runs.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

block() {  # the first ```bash block after the line that contains $1
    awk -v marker="$1" '
        index($0, marker)        { found = 1; next }
        found && /^```bash *$/   { inside = 1; next }
        inside && /^```/         { exit }
        inside                   { print }' "$repo/README.md"
}

if [ "${1:-}" = "--tests" ]; then
    cmd="$(block '<!-- newcomer: test command')"
    [ -n "$cmd" ] || { echo "newcomer.sh: README.md lost its '<!-- newcomer: test command' block" >&2; exit 1; }
    echo "newcomer.sh: the README's test command: $cmd"
    cd "$repo"
    exec bash -euo pipefail -c "$cmd"
fi

cmd="$(block '<!-- newcomer: first command')"
[ -n "$cmd" ] || { echo "newcomer.sh: README.md lost its '<!-- newcomer: first command' block" >&2; exit 1; }
work="$(mktemp -d /tmp/fsmingle-newcomer.XXXXXX)"
trap 'rm -rf "$work"' EXIT
# A clone has the committed files only, like a newcomer's; a fresh HOME keeps no pip or venv state.
git clone -q "$repo" "$work/fsmingle"
mkdir "$work/home"
cd "$work/fsmingle"
echo "newcomer.sh: in a fresh clone ($work/fsmingle), the README's first command:"
printf '  %s\n' "$cmd"
start=$(date +%s)
# No venv, PYTHONPATH or PIP_USER of ours leaks in; pip's site configuration (/etc/pip.conf) stays.
env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME -u PIP_USER HOME="$work/home" \
    bash -euo pipefail -c "$cmd"
echo "newcomer.sh: the README's first command passed in $(( $(date +%s) - start )) s"
