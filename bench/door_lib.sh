# Shared by bench/run_options.sh and bench/run_mixed_poisson.sh (sourced, not
# run): one ember-server with its OpenAI door on port 0, up until /health
# answers. The caller sets BIN_DIR and defines `die` (print, exit non-zero).
# shellcheck shell=bash

# start_http_server OUT T_SERVING ARGS...: starts $BIN_DIR/ember-server
# --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 ARGS (stdout and stderr in
# OUT/server.out and OUT/server.log), stopped when the script exits; sets
# SPID and HTTP (the door's ip:port) once GET /health answers, or dies after
# T_SERVING seconds or when the server exits.
start_http_server() {
    local out=$1 t_serving=$2 deadline
    shift 2
    "$BIN_DIR/ember-server" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 "$@" \
        >"$out/server.out" 2>"$out/server.log" &
    SPID=$!
    trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null' EXIT
    deadline=$(($(date +%s) + t_serving))
    HTTP=
    until [[ -n $HTTP ]] && python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://$HTTP/health" 2>/dev/null; do
        HTTP=$(sed -n 's/^http listening on //p' "$out/server.out")
        kill -0 "$SPID" 2>/dev/null || die "ember-server exited (see $out/server.log)"
        (($(date +%s) < deadline)) || die "not SERVING within ${t_serving}s"
        sleep 0.5
    done
}
