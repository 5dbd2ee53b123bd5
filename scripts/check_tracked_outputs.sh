#!/usr/bin/env bash
# Fails when git tracks generated output: bench runs (a `bench-out*`
# directory), loadgen reports (a `report/` directory outside a crate's
# `src/`), wheels (`*.whl`). Such files belong in .gitignore (which lists the
# same patterns), never in a commit. `--self-test` checks the pattern against
# paths that must and must not match.
#
# Usage: bash scripts/check_tracked_outputs.sh [--self-test]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A path is generated output when this matches it and it is not source.
pattern='(^|/)bench-out[^/]*/|(^|/)report/|\.whl$'
source_dir='(^|/)src/'

generated() { grep -E "$pattern" | grep -Ev "$source_dir" || true; }

if [[ ${1:-} == --self-test ]]; then
    must=$'bench-out-options-dry/plain.json\nloadgen/report/index.html\nreport/x.svg\nshellcheck_py-0.11.0.1-py3-none-any.whl'
    must_not=$'loadgen/src/report/charts.rs\nbench/run_options.sh\ndocs/img/loadgen-report.png'
    got=$(generated <<<"$must" | wc -l)
    [[ $got -eq 4 ]] || { echo "self-test: $got of 4 outputs matched" >&2; exit 1; }
    [[ -z $(generated <<<"$must_not") ]] || { echo "self-test: source matched" >&2; exit 1; }
    exit 0
fi

tracked=$(git ls-files | generated)
if [[ -n $tracked ]]; then
    echo "generated output is tracked (git rm it; .gitignore lists the patterns):" >&2
    echo "$tracked" | head -20 >&2
    exit 1
fi
