# Sourced by the end-to-end test scripts: the failure helpers and a fresh working directory.

# fail MESSAGE...: report the failure on stderr and exit 1.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# fresh_work_dir DIR: DIR emptied (created if missing) and made the current directory.
fresh_work_dir() {
  rm -rf "$1"
  mkdir -p "$1"
  cd "$1"
}

# expect_fail CODE REGEX CMD...: CMD must exit with CODE and print REGEX (its output is in out.txt).
expect_fail() {
  local code=$1 re=$2 rc=0
  shift 2
  "$@" > out.txt 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat out.txt; fail "'$*' exited with $rc, expected $code"; }
  grep -Eq "$re" out.txt || { cat out.txt; fail "'$*' did not say /$re/"; }
}
