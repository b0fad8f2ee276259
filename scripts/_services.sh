# shellcheck shell=bash
# Sourced by scripts/test, scripts/start and .ci/run (never run directly), after
# scripts/_python.sh (the helpers run `python`). For tests: make sure the local PostgreSQL and
# Redis servers that a test run needs are reachable, starting them when they are down. Only
# servers on this machine (localhost, 127.0.0.1, ::1 or a socket directory) are started; a
# remote one that cannot be reached is an error. For scripts/start: rt_prepare_database creates
# DATABASE_URL's PostgreSQL database when the server is reachable, and explains in one line
# when it is not (it starts no server).

_svc_say() { echo "==> $*" >&2; }
_svc_err() { echo "error: $*" >&2; }

# url_parts URL: prints scheme, host, port, user, password and path of a URL, one per line.
url_parts() {
    python - "$1" <<'PY'
import sys
from urllib.parse import unquote, urlsplit

url = urlsplit(sys.argv[1])
hostport = url.netloc.rpartition("@")[2]
if hostport.lower().startswith("%2f"):  # a socket directory, as in postgres://%2Fvar%2Frun...
    host = unquote(hostport.split(":")[0])
else:
    host = url.hostname or ""
for part in (url.scheme, host, url.port or "", unquote(url.username or ""),
             unquote(url.password or ""), unquote(url.path.lstrip("/"))):
    print(part)
PY
}

# rt_masked_url URL: prints URL with its password (if any) replaced by ***.
rt_masked_url() {
    python - "$1" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit

url = urlsplit(sys.argv[1])
userinfo, at, hostport = url.netloc.rpartition("@")
if at and ":" in userinfo:
    url = url._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{hostport}")
print(urlunsplit(url))
PY
}

_svc_is_local() {
    case "$1" in
    "" | localhost | 127.0.0.1 | ::1 | /*) return 0 ;;
    esac
    return 1
}

# A plain TCP connect, bounded in time (bash's /dev/tcp; no client needed).
_svc_tcp_open() {
    local host="${1:-127.0.0.1}" port="$2"
    [[ "$host" == /* ]] && return 1
    # shellcheck disable=SC2016 # expanded by the inner shell
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null
}

_svc_pg_ready() {
    local host="$1" port="$2"
    if command -v pg_isready >/dev/null 2>&1; then
        if [[ -n "$host" ]]; then
            pg_isready -q -t 3 -h "$host" -p "$port"
        else
            pg_isready -q -t 3 -p "$port"
        fi
    else
        _svc_tcp_open "$host" "$port"
    fi
}

# _svc_wait SECONDS COMMAND...: retries COMMAND once a second.
_svc_wait() {
    local i n="$1"
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 1
    done
    "$@"
}

# rt_ensure_postgres [HOST] [PORT]
rt_ensure_postgres() {
    local host="${1-127.0.0.1}" port="${2:-5432}" version
    _svc_pg_ready "$host" "$port" && return 0
    if ! _svc_is_local "$host"; then
        _svc_err "PostgreSQL at $host:$port is not reachable (and is not on this machine)"
        return 1
    fi
    if command -v pg_ctlcluster >/dev/null 2>&1 && [[ -d /etc/postgresql ]]; then
        # shellcheck disable=SC2012
        version="$(ls /etc/postgresql | sort -V | tail -n 1)"
        _svc_say "starting PostgreSQL $version (cluster main)"
        pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
    else
        _svc_err "PostgreSQL at ${host:-local socket}:$port is down and pg_ctlcluster is not available to start it"
        return 1
    fi
    if ! _svc_wait 30 _svc_pg_ready "$host" "$port"; then
        _svc_err "PostgreSQL at ${host:-local socket}:$port is still not accepting connections"
        return 1
    fi
}

# rt_ensure_pg_database HOST PORT USER PASSWORD DBNAME: creates DBNAME when it is missing.
rt_ensure_pg_database() {
    local host="$1" port="$2" user="$3" password="$4" db="$5" found
    local -a args=(-X -q -t -A -v ON_ERROR_STOP=1 -p "$port" -d postgres)
    [[ -n "$host" ]] && args+=(-h "$host")
    [[ -n "$user" ]] && args+=(-U "$user")
    [[ -n "$db" ]] || return 0
    if ! command -v psql >/dev/null 2>&1; then
        _svc_err "psql not found; cannot check that database '$db' exists"
        return 1
    fi
    # Variables are interpolated from standard input only (not from -c), hence the echo.
    found="$(echo "SELECT 1 FROM pg_database WHERE datname = :'db';" |
        PGPASSWORD="$password" psql "${args[@]}" -v db="$db")" || {
        _svc_err "could not query PostgreSQL at ${host:-local socket}:$port as ${user:-$USER}"
        return 1
    }
    [[ "$found" == 1 ]] && return 0
    _svc_say "creating PostgreSQL database $db"
    echo 'CREATE DATABASE :"db";' | PGPASSWORD="$password" psql "${args[@]}" -v db="$db" || {
        _svc_err "could not create database '$db'"
        return 1
    }
}

# rt_ensure_redis [HOST] [PORT]
rt_ensure_redis() {
    local host="${1:-127.0.0.1}" port="${2:-6379}"
    _svc_tcp_open "$host" "$port" && return 0
    if ! _svc_is_local "$host"; then
        _svc_err "Redis at $host:$port is not reachable (and is not on this machine)"
        return 1
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        _svc_err "Redis at $host:$port is down and redis-server is not installed"
        return 1
    fi
    _svc_say "starting Redis on port $port"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$port" --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || true
    if ! _svc_wait 15 _svc_tcp_open "$host" "$port"; then
        _svc_err "Redis at $host:$port is still not reachable (see /var/log/redis/ci.log)"
        return 1
    fi
}

# rt_prepare_database: for a PostgreSQL DATABASE_URL, creates its database when the server is
# reachable and the database is missing; fails with one line naming the URL (password masked)
# when the server cannot be reached. Other URLs (SQLite, unset) need nothing.
rt_prepare_database() {
    local -a db
    [[ -n "${DATABASE_URL:-}" ]] || return 0
    mapfile -t db < <(url_parts "$DATABASE_URL")
    case "${db[0]:-}" in
    postgres | postgresql | pgsql | postgis) ;;
    *) return 0 ;;
    esac
    if ! _svc_pg_ready "${db[1]:-}" "${db[2]:-5432}"; then
        _svc_err "cannot reach PostgreSQL at $(rt_masked_url "$DATABASE_URL") (DATABASE_URL);" \
            "start the server or fix the URL"
        return 1
    fi
    rt_ensure_pg_database "${db[1]:-}" "${db[2]:-5432}" "${db[3]:-}" "${db[4]:-}" "${db[5]:-}"
}
