#!/usr/bin/env bash
# Container smoke test: builds the CPU image from deploy/Dockerfile and runs the
# server and a loadgen as two containers on a private (internal, no route out)
# podman network, the way compose and Kubernetes run them:
#
#   1. base image: a minimal Debian bookworm made with debootstrap and imported
#      into podman (no registry image can be pulled here); cached.
#   2. image: deploy/Dockerfile with VARIANT=cpu BINARIES=prebuilt on that base,
#      from the host's release binaries (built here if missing).
#   3. server container, read-only root, all capabilities dropped, uid 10001:
#      `--listen 0.0.0.0:50051 --preset tiny --device cpu`; waits for
#      grpc.health SERVING with the image's ember-healthcheck.
#   4. loadgen container -> http://ember:50051 (network alias); checks its JSON:
#      every request ok; then /metrics answers.
#   5. SIGTERM the server (podman stop): it must exit 0 within the drain time.
#
# Needs root, podman + runc + debootstrap (installed with apt-get if missing),
# and Debian's package mirror for the first base build.
#
# Environment:
#   EMBER_SMOKE_CACHE    base rootfs tarball cache (default /var/cache/ember-smoke)
#   EMBER_SMOKE_MIRROR   Debian mirror for debootstrap (default deb.debian.org)
#   EMBER_SMOKE_BIN_DIR  where ember-server and loadgen are (default target/release;
#                        built there (CPU features) if missing)
#   EMBER_SMOKE_BUILD=0  fail instead of building missing release binaries
#   EMBER_SMOKE_REQUESTS, EMBER_SMOKE_TOKENS   the loadgen workload (32, 16)
#
# The base and the image (localhost/ember-server:smoke-cpu) stay in podman's
# store for the next run; the containers and the network are removed.
#
# Usage: bash deploy/smoke.sh        (prints a phase timing table at the end)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${EMBER_SMOKE_CACHE:-/var/cache/ember-smoke}
mirror=${EMBER_SMOKE_MIRROR:-http://deb.debian.org/debian}
requests=${EMBER_SMOKE_REQUESTS:-32}
tokens=${EMBER_SMOKE_TOKENS:-16}
base_tag=localhost/ember-base:bookworm
image_tag=localhost/ember-server:smoke-cpu
id="ember-smoke-$$"
net="$id-net"
server="$id-server"
drain_timeout=10 # the server's --shutdown-timeout
t_start=$(date +%s.%N)
t_last=$t_start
timings=()

log() { printf '[smoke %6.1fs] %s\n' "$(elapsed "$t_start")" "$*"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
phase_done() {
    timings+=("$(printf '%-34s %7.1f s' "$1" "$(elapsed "$t_last")")")
    t_last=$(date +%s.%N)
}
die() {
    log "FAILED: $*"
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root (podman with runc and cgroupfs, debootstrap)"

missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi

work=$(mktemp -d)
# podman on these machines: runc, cgroupfs, and no default ulimits.
export CONTAINERS_CONF="$work/containers.conf"
printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"
pm() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

cleanup() {
    local rc=$?
    if ((rc != 0)) && pm container exists "$server" 2>/dev/null; then
        echo "---- server log (last 40 lines)"
        pm logs --tail 40 "$server" 2>&1 || true
    fi
    pm rm -f -t 0 "$server" "$id-loadgen" >/dev/null 2>&1 || true
    pm network rm -f "$net" >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

# 1. Base image --------------------------------------------------------------
if pm image exists "$base_tag"; then
    log "base image $base_tag present"
else
    tarball="$cache_dir/bookworm-minbase.tar"
    if [[ ! -s "$tarball" ]]; then
        log "debootstrap --variant=minbase bookworm (first run only; ~1.5 min)"
        mkdir -p "$cache_dir"
        # curl: ember-healthcheck. ca-certificates: apt over https if needed.
        debootstrap --variant=minbase --include=curl,ca-certificates \
            bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
            || { tail -20 "$work/debootstrap.log"; die "debootstrap"; }
        # debootstrap leaves the downloaded .debs and package lists behind.
        rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
        tar -C "$work/rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$work/rootfs"
    fi
    log "podman import $tarball"
    pm import --quiet "$tarball" "$base_tag" >/dev/null
fi
phase_done "base image"

# 2. Binaries and image ------------------------------------------------------
bin_dir=${EMBER_SMOKE_BIN_DIR:-$repo/target/release}
if [[ ! -x "$bin_dir/ember-server" || ! -x "$bin_dir/loadgen" ]]; then
    [[ ${EMBER_SMOKE_BUILD:-1} != 0 && $bin_dir == "$repo/target/release" ]] \
        || die "no ember-server and loadgen in $bin_dir"
    log "cargo build --release (CPU; slow on 2 cores)"
    (cd "$repo" && bash scripts/setup.sh && cargo build --release -p ember-server -p ember-loadgen)
fi
phase_done "release binaries"

# A small build context: the Dockerfile, the healthcheck and the two binaries.
ctx="$work/ctx"
mkdir -p "$ctx/deploy" "$ctx/target/release"
cp "$repo/deploy/Dockerfile" "$repo/deploy/ember-healthcheck" "$ctx/deploy/"
for b in ember-server loadgen; do
    if command -v strip >/dev/null 2>&1; then
        strip -o "$ctx/target/release/$b" "$bin_dir/$b"
    else
        cp "$bin_dir/$b" "$ctx/target/release/$b"
    fi
done
log "podman build (VARIANT=cpu BINARIES=prebuilt)"
pm build --quiet --pull=never --format docker -f "$ctx/deploy/Dockerfile" \
    --build-arg VARIANT=cpu --build-arg BINARIES=prebuilt \
    --build-arg CPU_IMAGE="$base_tag" -t "$image_tag" "$ctx" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; die "podman build"; }
log "image $image_tag: $(pm image inspect --format '{{.Size}}' "$image_tag" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
phase_done "image build"

# 3. Server ------------------------------------------------------------------
pm network create --internal "$net" >/dev/null
# As Kubernetes runs it (deploy/k8s/deployment.yaml's securityContext).
pm run -d --name "$server" --network "$net" --network-alias ember \
    --no-healthcheck --read-only --tmpfs /tmp --tmpfs /home/ember/.cache:rw,mode=1777 \
    --cap-drop ALL --security-opt no-new-privileges \
    "$image_tag" --listen 0.0.0.0:50051 --metrics-port 9090 \
    --device cpu --preset tiny --max-batch-size 16 --shutdown-timeout "$drain_timeout" \
    >/dev/null 2>"$work/run.err" || { cat "$work/run.err"; die "podman run (server)"; }
log "server started; waiting for grpc.health SERVING"
deadline=$((SECONDS + 120))
until status=$(pm exec "$server" ember-healthcheck 2>/dev/null); do
    [[ $(pm inspect --format '{{.State.Running}}' "$server") == true ]] \
        || die "server exited while starting"
    ((SECONDS < deadline)) || die "server not SERVING within 120 s (last: $status)"
    sleep 0.5
done
log "server: $status"
phase_done "server start -> SERVING"

# 4. Loadgen -----------------------------------------------------------------
mkdir -p "$work/out"
chown 10001:10001 "$work/out"
log "loadgen: $requests requests x $tokens tokens, absolute schedule, 5 ms apart"
pm run --name "$id-loadgen" --rm --network "$net" --entrypoint loadgen \
    --read-only --cap-drop ALL --security-opt no-new-privileges \
    -v "$work/out:/out" "$image_tag" \
    --target http://ember:50051 --num-requests "$requests" --max-new-tokens "$tokens" \
    --no-stop-on-eos --unique-prompts --submit-schedule absolute --submit-interval-ms 5 \
    --warmup-runs 1 --repeat-runs 1 --json /out/loadgen.json >"$work/loadgen.log" 2>&1 \
    || { cat "$work/loadgen.log"; die "loadgen exited non-zero"; }
sed -n '/=== streaming benchmark ===/,$p' "$work/loadgen.log" | head -40
python3 - "$work/out/loadgen.json" "$requests" <<'EOF' || die "loadgen JSON check"
import json, sys
report = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
runs = report.get("runs") or []
assert runs, "no measured runs in the JSON"
for run in runs:
    assert run.get("requests") == want, f"requests {run.get('requests')} != {want}"
    assert run.get("ok") == want and not run.get("failed"), f"ok {run.get('ok')}, failed {run.get('failed')}"
ttft = runs[-1].get("metrics", {}).get("ttft_ms", {})
print(f"loadgen JSON ok: {want} requests ok, TTFT p50 {ttft.get('p50')} ms p99 {ttft.get('p99')} ms, "
      f"{runs[-1].get('throughput_completion_tps')} completion tok/s")
EOF
metrics=$(pm exec "$server" curl -fsS --max-time 5 http://127.0.0.1:9090/metrics) \
    || die "/metrics did not answer"
grep -q '^vllm:time_to_first_token_seconds_count' <<<"$metrics" \
    || die "/metrics has no vllm:time_to_first_token_seconds series"
log "/metrics: $(grep -c '^vllm:' <<<"$metrics") vllm: samples, $(grep -c '^ember:' <<<"$metrics") ember: samples"
phase_done "loadgen run + checks"

# 5. Graceful stop -------------------------------------------------------------
log "SIGTERM (podman stop, grace $((drain_timeout + 10)) s)"
pm stop -t $((drain_timeout + 10)) "$server" >/dev/null
code=$(pm inspect --format '{{.State.ExitCode}}' "$server")
[[ $code == 0 ]] || die "server exit code $code after SIGTERM (want 0)"
log "server drained and exited 0"
phase_done "SIGTERM -> exit 0"

echo
echo "smoke: ok"
printf '  %s\n' "${timings[@]}"
printf '  %-34s %7.1f s\n' "total" "$(elapsed "$t_start")"
