#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the test suite and print its DSN.
#
#   eval "$(bash .ci/postgres.sh)"        # start; exports TRACERAG_TEST_POSTGRES_DSN and
#                                         # TRACERAG_TEST_POSTGRES_DIR
#   bash .ci/postgres.sh stop [DIR]       # stop it and delete its directory
#                                         # (DIR defaults to $TRACERAG_TEST_POSTGRES_DIR)
#
# Installs PostgreSQL from Debian's packages when no server binaries are found (needs root or
# sudo), then runs initdb + pg_ctl in a new temporary directory, listening on 127.0.0.1 on a
# free port (unix socket in that directory too), and creates the database "tracerag_test".
# The server refuses to run as root, so as root it runs as the "postgres" system user (created
# if missing). Everything goes to stderr except the export lines on stdout.
# Environment: PG_FSYNC=off trades durability for speed (default on).
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root (or sudo) to run: $*"; return 1
    fi
}

find_bindir() {
    local d
    if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"
        return 0
    fi
    # Debian puts server binaries in /usr/lib/postgresql/<major>/bin, off the PATH.
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
        if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
    done
    return 1
}

run_as() {  # run_as USER CMD...: run a command as USER (or as ourselves when USER is empty)
    local user=$1; shift
    if [ -z "$user" ]; then "$@"
    elif command -v runuser >/dev/null; then runuser -u "$user" -- "$@"
    else su -s /bin/sh "$user" -c "$(printf '%q ' "$@")"
    fi
}

stop() {
    local dir=${1:-${TRACERAG_TEST_POSTGRES_DIR:-}}
    if [ -z "$dir" ] || [ ! -d "$dir/data" ]; then log "nothing to stop (${dir:-no dir})"; return 0; fi
    local bindir user=""
    bindir=$(find_bindir) || { log "no pg_ctl found"; return 1; }
    [ "$(id -u)" -eq 0 ] && user=$(stat -c %U "$dir/data")
    run_as "$user" "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
    log "stopped and removed $dir"
}

free_port() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local port
    for port in $(seq 54320 54999); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    return 1
}

start() {
    local bindir
    if ! bindir=$(find_bindir); then
        log "PostgreSQL not found; installing it from Debian's packages"
        as_root apt-get update >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            postgresql >&2
        bindir=$(find_bindir) || { log "PostgreSQL still not found after install"; exit 1; }
    fi
    log "using $bindir ($("$bindir/postgres" --version))"

    local user=""
    if [ "$(id -u)" -eq 0 ]; then
        user=postgres
        if ! id "$user" >/dev/null 2>&1; then
            log "creating system user $user"
            useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$user"
        fi
    fi

    local dir port
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tracerag-pg.XXXXXX")
    chmod 755 "$dir"
    [ -n "$user" ] && chown "$user" "$dir"
    port=$(free_port)

    run_as "$user" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
        --locale=C --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2; log "initdb failed"; exit 1; }
    local opts="-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=${PG_FSYNC:-on}"
    opts="$opts -c max_connections=200"
    if ! run_as "$user" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$opts" -w \
        -t 60 start >&2; then
        cat "$dir/server.log" >&2 || true
        log "server did not start"
        exit 1
    fi
    local psql="$bindir/psql"
    [ -x "$psql" ] || psql=$(command -v psql)
    "$psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
        -c "CREATE DATABASE tracerag_test" >&2
    local dsn="postgresql://postgres@127.0.0.1:$port/tracerag_test"
    log "server running in $dir on port $port"
    echo "export TRACERAG_TEST_POSTGRES_DSN='$dsn'"
    echo "export TRACERAG_TEST_POSTGRES_DIR='$dir'"
}

case "${1:-start}" in
    start) start ;;
    stop) shift; stop "$@" ;;
    *) log "usage: $0 [start|stop [DIR]]"; exit 2 ;;
esac
