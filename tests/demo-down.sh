#!/usr/bin/env bash
# `make demo-down`: stops the demo that `make demo-up` (`DEMO_KEEP=1 make demo`) keeps up, from
# another terminal, and removes its state directory (tests/src/kept.rs writes it).
#
# The demo is one test process in the foreground of its terminal; every process it started is
# in one of its clusters' process groups, each led by a watchdog that ends its group when the
# test process goes. So: SIGTERM to the test process (`pid`), which tears everything down as on
# Ctrl-C; SIGKILL after STOP_WAIT seconds (30) if it is still there; then SIGKILL to any of its
# clusters' groups (`groups`) still led by a watchdog (never to a group that another process
# leads now: a pid can be reused); then the directory goes.
#
#   tests/demo-down.sh DIR     DIR: the state directory (target/demo)
set -euo pipefail

dir=${1:?usage: $0 STATE_DIR}
wait=${STOP_WAIT:-30}

if [ ! -d "$dir" ]; then
  echo "demo-down: no kept demo ($dir does not exist)"
  exit 0
fi

# Whether pid $1 is the demo test (`target/debug/deps/demo-<hash>`).
is_demo() {
  local exe
  exe=$({ tr '\0' '\n' < "/proc/$1/cmdline"; } 2>/dev/null | head -n 1) || return 1
  case "${exe##*/}" in demo-*) return 0 ;; *) return 1 ;; esac
}

# Whether pid $1 leads a cluster's process group: the watchdog of tests/src/cluster/process.rs.
is_watchdog() {
  { tr '\0' ' ' < "/proc/$1/cmdline"; } 2>/dev/null | grep -q "while read -r _; do :; done; kill -TERM 0"
}

# Read first: a demo that ends cleanly removes the directory itself.
pid=$(cat "$dir/pid" 2>/dev/null || true)
groups=$(cat "$dir/groups" 2>/dev/null || true)
if [ -n "$pid" ] && is_demo "$pid"; then
  kill -TERM "$pid"
  for ((i = 0; i < wait * 10; i++)); do
    is_demo "$pid" || break
    sleep 0.1
  done
  if is_demo "$pid"; then
    echo "demo-down: pid $pid still there after ${wait}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  echo "demo-down: stopped the demo (pid $pid)"
else
  echo "demo-down: the demo of $dir is not running (pid ${pid:-unknown})"
fi

# The watchdogs end their groups within seconds of the test process; wait for them, then end
# what is still there.
for group in $groups; do
  for ((i = 0; i < 50; i++)); do
    is_watchdog "$group" || break
    sleep 0.1
  done
  if is_watchdog "$group"; then
    echo "demo-down: process group $group still there; killing it"
    kill -KILL -- "-$group" 2>/dev/null || true
  fi
done

rm -rf "$dir"
echo "demo-down: removed $dir"
