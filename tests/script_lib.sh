# Sourced by the end-to-end test scripts: the failure helper and a fresh working directory.

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
