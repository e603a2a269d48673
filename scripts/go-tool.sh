# Shell functions of the scripts that build one tool from the Go module proxy
# (build-tools.sh, build-registry.sh): sourced after lib.sh, never run.

# use_prebuilt VAR: when $VAR names an executable, prints its directory and ends the script
# (the operator's own binary, nothing built); a VAR naming anything else is said and ignored.
use_prebuilt() {
  local path=${!1:-}
  [[ -n "$path" ]] || return 0
  if [[ -x "$path" ]]; then
    log "using $path ($1)"
    dirname "$path"
    exit 0
  fi
  log "$1=$path is not executable; building instead"
}

# print_if_built OUT NAME...: prints OUT and ends the script when every NAME is built there.
print_if_built() {
  local out=$1 name
  shift
  for name in "$@"; do [[ -x "$out/$name" ]] || return 0; done
  echo "$out"
  exit 0
}

# build_lock OUT NAME...: one build of OUT at a time; a second one waits, then finds it
# built (and ends as print_if_built does).
build_lock() {
  mkdir -p "$1"
  exec 9>"$1.lock"
  flock 9
  print_if_built "$@"
}

# tool_module WORK NAME MODULE VERSION IMPORT: WORK becomes a module requiring MODULE at
# VERSION and importing the package IMPORT, its dependencies resolved.
tool_module() {
  local work=$1 name=$2 module=$3 version=$4 import=$5
  mkdir -p "$work"
  printf 'module rpw.local/%s\n\ngo 1.24\n' "$name" > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$import" > "$work/tools.go"
  log "$name $version: resolving modules"
  (cd "$work" && go get "$module@$version" >&2 && go mod tidy -e >&2)
}
