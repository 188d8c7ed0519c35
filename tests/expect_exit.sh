#!/usr/bin/env bash
# expect_exit.sh CODE REGEX CMD...: CMD must exit with CODE and print (stdout or stderr) a line matching REGEX.
code=$1 re=$2
shift 2
out=$("$@" 2>&1)
rc=$?
if [ "$rc" != "$code" ]; then
  printf '%s\n' "$out"
  echo "FAIL: '$*' exited with $rc, expected $code" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$re"; then
  printf '%s\n' "$out"
  echo "FAIL: '$*' did not print /$re/" >&2
  exit 1
fi
echo "OK: exit $code and /$re/"
