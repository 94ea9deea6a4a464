#!/usr/bin/env bash
# Nothing left behind: `make test` ends with `tests/leftovers.sh check`, which fails when a process
# the tests started is still running once they are done (an API server, etcd, kwok, a controller,
# a server or agent, a kubelet shim, chromedriver, Chromium...).
#
# How a process is known to be the tests': `make test` exports ROLLOUTS_DISPATCH_TEST_RUN (one
# value per run) and every process started under it inherits it (no harness clears the
# environment). `check` lists the processes whose environment holds this run's value, less the
# chain of its own ancestors (make and its shells), waits up to LEFTOVERS_WAIT seconds (20) for
# them to end (a cluster's watchdog ends its group a few seconds after the test), then names each
# one, ends it, and fails.
#
#   tests/leftovers.sh check      the check (needs ROLLOUTS_DISPATCH_TEST_RUN)
#   tests/leftovers.sh selftest   shows the check failing on a deliberately leaked process, then
#                                 passing once it is gone (so the check itself cannot rot)
set -euo pipefail

# The pids of this (sub)shell and its ancestors.
ancestors() {
  local pid=$BASHPID
  while [ "$pid" -gt 1 ]; do
    echo "$pid"
    pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null) || break
  done
}

# The pids of the processes marked with this run's value, ancestors excepted.
marked() {
  local mark="ROLLOUTS_DISPATCH_TEST_RUN=$1" skip pid
  skip=" $(ancestors | tr '\n' ' ') "
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    case "$skip" in *" $pid "*) continue ;; esac
    if grep -qzxF "$mark" "$dir/environ" 2>/dev/null; then
      echo "$pid"
    fi
  done
}

check() {
  local mark=${ROLLOUTS_DISPATCH_TEST_RUN:?run under make test, which sets ROLLOUTS_DISPATCH_TEST_RUN}
  local wait=${LEFTOVERS_WAIT:-20} left
  for ((i = 0; ; i++)); do
    left=$(marked "$mark")
    [ -z "$left" ] && { echo "leftovers: none (no process of this test run is still running)"; return 0; }
    [ "$i" -ge "$wait" ] && break
    sleep 1
  done
  echo "leftovers: FAILED: $(echo "$left" | wc -l) processes started by this test run are still running:"
  for pid in $left; do
    echo "  pid $pid (parent $(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null || echo '?')): $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
  done
  echo "leftovers: each test must end what it started (see tests/README.md, 'Nothing left behind'); ending them now"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
  return 1
}

selftest() {
  local mark="selftest-$$-$RANDOM" leaked
  ROLLOUTS_DISPATCH_TEST_RUN=$mark sleep 300 &
  leaked=$!
  disown "$leaked"  # killed by the check below; no job report
  if ROLLOUTS_DISPATCH_TEST_RUN=$mark LEFTOVERS_WAIT=0 "$0" check > /dev/null; then
    kill "$leaked" 2>/dev/null || true
    echo "leftovers: selftest FAILED: a leaked process (pid $leaked) passed the check"
    return 1
  fi
  # Killed by the check (a zombie until this script ends: no environment, so not counted).
  if ! ROLLOUTS_DISPATCH_TEST_RUN=$mark LEFTOVERS_WAIT=0 "$0" check > /dev/null; then
    echo "leftovers: selftest FAILED: the check failed with nothing leaked"
    return 1
  fi
  echo "leftovers: selftest ok (a leaked process fails the check, none passes it)"
}

case "${1:-}" in
  check) check ;;
  selftest) selftest ;;
  *) echo "usage: $0 check|selftest" >&2; exit 2 ;;
esac
