#!/bin/sh
# Several status.py calls in one critical section: nothing else that takes the
# loop's lock (a cron tick, a CI job, an operator) can run between them.
#
# usage: wrap-status.sh [LOOP_DIR]          (default /srv/loops/nightly)
#   STATUS_PY  the loop's status script    (default /srv/loops/scripts/status.py)
set -eu
loop=${1:-/srv/loops/nightly}
STATUS_PY=${STATUS_PY:-/srv/loops/scripts/status.py}
export STATUS_PY

# Form 1, -c: one shell command, run by /bin/sh -c while looplock holds the
# lock. Quote the whole command as one word, and hand values in through the
# environment ("$STATUS_PY"), never by pasting them into the string.
# shellcheck disable=SC2016 # expanded by the inner sh, not here
looplock -w 30 --operation approve-and-tick "$loop" -c \
  'python3 "$STATUS_PY" --approve --loop nightly && python3 "$STATUS_PY" --tick'

# Form 2, --: the command is `sh -c SCRIPT sh ARG...`; the arguments arrive as
# "$1"... unchanged. -p monitor waits at most 1 s: a busy loop fails this run
# with 75 (retry at the next scheduled poll).
# shellcheck disable=SC2016
looplock -p monitor --operation check-gate "$loop" -- sh -c '
  python3 "$1" --check-gate &&
  python3 "$1" --report
' sh "$STATUS_PY"
