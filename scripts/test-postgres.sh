#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL server.
#
#   scripts/test-postgres.sh make test
#   scripts/test-postgres.sh .venv/bin/python -m pytest -q tests/test_ledger_conformance.py
#
# Starts a fresh cluster (initdb) in a temporary folder, listening on a free port on 127.0.0.1 with
# password authentication, creates the database `ratchet_test`, runs the command with
# RATCHET_TEST_POSTGRES_URL=postgresql://ratchet:PASSWORD@127.0.0.1:PORT/ratchet_test exported, and
# stops the server and deletes the folder when the command ends (also on Ctrl-C). Exits with the
# command's status. Needs the PostgreSQL server binaries (Debian: apt-get install postgresql); run
# as root, the server runs as the `postgres` user (initdb refuses root).
set -euo pipefail

if [ $# -eq 0 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

# the server binaries: PG_BIN, else the newest /usr/lib/postgresql/*/bin (Debian), else PATH
if [ -z "${PG_BIN:-}" ]; then
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$PG_BIN" ] && command -v initdb >/dev/null; then
        PG_BIN=$(dirname "$(command -v initdb)")
    fi
fi
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    echo "test-postgres: no PostgreSQL server binaries found; install them (apt-get install postgresql) or set PG_BIN" >&2
    exit 1
fi

as_server=()
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        echo "test-postgres: running as root needs a 'postgres' user to run the server (the Debian package creates it)" >&2
        exit 1
    fi
    as_server=(runuser -u postgres --)
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/ratchet-pg.XXXXXX")
chmod 700 "$dir"
[ ${#as_server[@]} -eq 0 ] || chown postgres: "$dir"

cleanup() {
    "${as_server[@]}" "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

password=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$password" > "$dir/pwfile"
[ ${#as_server[@]} -eq 0 ] || chown postgres: "$dir/pwfile"
"${as_server[@]}" "$PG_BIN/initdb" -D "$dir/data" -U ratchet --pwfile="$dir/pwfile" --auth=scram-sha-256 \
    -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
rm -f "$dir/pwfile"

for attempt in 1 2 3 4 5; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if "${as_server[@]}" "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null; then
        break
    fi
    if [ "$attempt" = 5 ]; then
        cat "$dir/server.log" >&2
        exit 1
    fi
done

PGPASSWORD=$password "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U ratchet ratchet_test
export RATCHET_TEST_POSTGRES_URL="postgresql://ratchet:$password@127.0.0.1:$port/ratchet_test"
echo "test-postgres: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (database ratchet_test)" >&2

status=0
"$@" || status=$?
exit "$status"
