#!/usr/bin/env bash
# Lint the tree: `ruff check` over the Python code (rules in pyproject.toml,
# [tool.ruff]) and `clang-format --dry-run --Werror` over the C++/CUDA
# sources of cpp/, tests/cpp/, python/bindings/ and examples/cpp/ (style in
# .clang-format). ruff's formatter is not used (see pyproject.toml).
#
#   bash scripts/lint.sh                 # both checks; exits non-zero on any finding
#   bash scripts/lint.sh ruff            # one check only (or: clang-format)
#   bash scripts/lint.sh --fix [TOOL]    # apply ruff's safe fixes and clang-format -i instead
#   HISPARSE_LINT_REPORT=1 bash scripts/lint.sh   # print the findings, exit 0
#
# A missing tool, or a clang-format of another major version (its output
# differs between versions), is installed with pip at the versions below.
# Environment: PYTHON (python3), HISPARSE_LINT_REPORT.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
report=${HISPARSE_LINT_REPORT:-0}
RUFF_VERSION=0.17.6
CLANG_FORMAT_VERSION=23.1.5

fix=0
tools=()
for arg in "$@"; do
  case "$arg" in
    --fix) fix=1 ;;
    ruff | clang-format) tools+=("$arg") ;;
    *)
      echo "lint.sh: unknown argument '$arg' (expected ruff, clang-format or --fix)" >&2
      exit 2
      ;;
  esac
done
[ ${#tools[@]} -gt 0 ] || tools=(ruff clang-format)

step() { printf '\n==> %s\n' "$*"; }

ruff_command() {
  if "$python" -m ruff --version > /dev/null 2>&1; then
    echo "$python -m ruff"
  elif command -v ruff > /dev/null 2>&1; then
    echo ruff
  else
    "$python" -m pip install -q "ruff==$RUFF_VERSION" >&2
    echo "$python -m ruff"
  fi
}

clang_format_major() { "$1" --version 2>/dev/null | sed -nE 's/.*clang-format version ([0-9]+).*/\1/p'; }

clang_format_command() {
  local wanted=${CLANG_FORMAT_VERSION%%.*} found
  found=$(command -v clang-format || true)
  if [ -n "$found" ] && [ "$(clang_format_major "$found")" = "$wanted" ]; then
    echo "$found"
    return
  fi
  found=$("$python" -c 'import clang_format; print(clang_format.get_executable("clang-format"))' 2>/dev/null || true)
  if [ -z "$found" ] || [ "$(clang_format_major "$found")" != "$wanted" ]; then
    "$python" -m pip install -q "clang-format==$CLANG_FORMAT_VERSION" >&2
    found=$("$python" -c 'import clang_format; print(clang_format.get_executable("clang-format"))')
  fi
  echo "$found"
}

cpp_sources() {
  local dirs=(cpp tests/cpp python/bindings examples/cpp bench)
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git ls-files -- "${dirs[@]}"
  else
    find "${dirs[@]}" -type f
  fi | grep -E '\.(c|h|cc|cpp|hpp|cu|cuh)$' | sort
}

failed=()

run_ruff() {
  local ruff
  ruff=$(ruff_command)
  step "ruff ($($ruff --version))"
  if [ "$fix" = 1 ]; then
    $ruff check --fix . || failed+=(ruff)
  elif ! $ruff check .; then
    failed+=(ruff)
  fi
}

run_clang_format() {
  local clang_format files
  clang_format=$(clang_format_command)
  step "clang-format ($("$clang_format" --version | sed -E 's/.*version ([0-9.]+).*/\1/'))"
  mapfile -t files < <(cpp_sources)
  if [ "$fix" = 1 ]; then
    "$clang_format" -i "${files[@]}"
    echo "formatted ${#files[@]} files"
    return
  fi
  local unformatted=() changed=0 file lines
  for file in "${files[@]}"; do
    if ! "$clang_format" --dry-run --Werror "$file" > /dev/null 2>&1; then
      lines=$("$clang_format" "$file" | diff "$file" - | grep -c '^[<>]' || true)
      unformatted+=("$file ($lines lines)")
      changed=$((changed + lines))
    fi
  done
  if [ ${#unformatted[@]} -gt 0 ]; then
    printf '  %s\n' "${unformatted[@]}"
    echo "${#unformatted[@]} of ${#files[@]} files need formatting ($changed lines change);" \
      "bash scripts/lint.sh --fix clang-format applies it"
    failed+=(clang-format)
  else
    echo "${#files[@]} files formatted"
  fi
}

for tool in "${tools[@]}"; do
  case "$tool" in
    ruff) run_ruff ;;
    clang-format) run_clang_format ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then
  if [ "$report" = 1 ]; then
    step "findings in: ${failed[*]} (HISPARSE_LINT_REPORT=1: not failing)"
    exit 0
  fi
  printf '\nlint.sh: FAILED: %s\n' "${failed[*]}" >&2
  exit 1
fi
step "lint passed"
