# shellcheck shell=bash
# Sourced by scripts/start and scripts/test (never run directly).
#
# 1. Finds a Python >= 3.12 (only needed when .venv must be (re)created):
#    $PYTHON if set; python3.13, python3.12, python3 on PATH; pyenv installs under
#    /root/.pyenv, $PYENV_ROOT and ~/.pyenv (3.12 and newer, newest first);
#    /usr/local/bin/python3.1x and /usr/bin/python3.1x; `uv python find`.
#    Each candidate is run to check its real version (pyenv shims exist for versions
#    that are not active, and fail when run).
# 2. Keeps a virtualenv at .venv, recreating it when its Python is missing, broken or < 3.12
#    (or differs from an explicitly set $PYTHON).
# 3. Installs the locked set, exact versions with their hashes, then the project itself
#    (editable, no dependencies): requirements/start.txt for scripts/start (the product with
#    every optional extra of the runtime, openai, anthropic, mcp, otel, redis, and what this
#    repository's project settings use, whitenoise and dj-database-url), requirements/test.txt
#    with RT_EXTRAS=test, as scripts/test sets it (the test tools besides). Nothing is resolved
#    anew: a fresh clone installs what CI tested, on any day; scripts/lock renews the lock.
#    It installs only when pyproject.toml or the lock file changed since the last successful
#    install of that set (their sha256 is kept per set: .venv/.pyproject.sha256 for the
#    product, .venv/.pyproject.test.sha256 for the test tools). Shows each package as pip
#    collects it; on failure the tail of .venv/pip-install.log is shown.
# 4. Puts .venv/bin first on PATH, so `python` below means the project's interpreter.
#
# Returns non-zero (callers: `source scripts/_python.sh || exit 1`) with a message on stderr.

_rt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_rt_venv="$_rt_root/.venv"
_rt_extras="${RT_EXTRAS:-}"
# One stamp per installed set; installing the test set installs the product too.
_rt_stamp="$_rt_venv/.pyproject${_rt_extras:+.$_rt_extras}.sha256"
_rt_product_stamp="$_rt_venv/.pyproject.sha256"

_rt_say() { echo "==> $*" >&2; }
_rt_err() { echo "error: $*" >&2; }

# Prints "3.13.0" for a runnable Python >= 3.12; fails otherwise (silently).
_rt_py_version() {
    "$1" -c 'import sys
if sys.version_info < (3, 12):
    sys.exit(1)
print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

# Sets _rt_python to the first usable interpreter; explains what it tried when none is.
_rt_find_python() {
    local cand ver name
    local -a cands=() tried=() globbed=()
    _rt_python=""

    if [[ -n "${PYTHON:-}" ]]; then
        if ver="$(_rt_py_version "$PYTHON")" && "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
            _rt_python="$PYTHON"
            return 0
        fi
        _rt_err "\$PYTHON is set to '$PYTHON', which is not a runnable Python >= 3.12 with the" \
            "venv and ensurepip modules. Unset PYTHON to search automatically."
        return 1
    fi

    for name in python3.13 python3.12 python3; do
        cand="$(command -v "$name" 2>/dev/null)" && cands+=("$cand")
    done
    for cand in /root/.pyenv/versions/3.1[2-9]*/bin/python \
        "${PYENV_ROOT:-/nonexistent}"/versions/3.1[2-9]*/bin/python \
        "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python \
        /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
        [[ -x "$cand" ]] && globbed+=("$cand")
    done
    if ((${#globbed[@]})); then
        # Newest version first; the same install may be listed twice, which is harmless.
        mapfile -t globbed < <(printf '%s\n' "${globbed[@]}" | sort -rV)
        cands+=("${globbed[@]}")
    fi
    if command -v uv >/dev/null 2>&1; then
        cand="$(uv python find '>=3.12' 2>/dev/null)" && [[ -n "$cand" ]] && cands+=("$cand")
    fi

    for cand in "${cands[@]}"; do
        if ! ver="$(_rt_py_version "$cand")"; then
            if ver="$("$cand" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"; then
                tried+=("$cand (Python $ver, too old)")
            else
                tried+=("$cand (does not run)")
            fi
            continue
        fi
        if ! "$cand" -c 'import venv, ensurepip' 2>/dev/null; then
            tried+=("$cand (Python $ver, but no venv/ensurepip module)")
            continue
        fi
        _rt_python="$cand"
        return 0
    done

    _rt_err "no Python >= 3.12 found."
    {
        echo "  Looked for: \$PYTHON (unset); python3.13, python3.12, python3 on PATH;"
        echo "  /root/.pyenv/versions/3.1[2-9]*/bin/python, \$PYENV_ROOT/versions/..., ~/.pyenv/versions/...;"
        echo "  /usr/local/bin/python3.1[2-9], /usr/bin/python3.1[2-9]; 'uv python find >=3.12'."
        if ((${#tried[@]})); then
            echo "  Tried:"
            printf '    %s\n' "${tried[@]}"
        fi
        echo "  Install Python 3.12 or newer (with venv), or set PYTHON=/path/to/python3.12."
    } >&2
    return 1
}

# The lock file of the set being installed.
_rt_lock="$_rt_root/requirements/${_rt_extras:-start}.txt"

# Prints the sha256 of pyproject.toml and the lock file $1 together.
_rt_hash_pyproject() {
    "$_rt_venv/bin/python" -c 'import hashlib, sys
h = hashlib.sha256()
for path in sys.argv[1:]:
    h.update(open(path, "rb").read())
print(h.hexdigest())' "$_rt_root/pyproject.toml" "$1"
}

_rt_ensure_env() {
    local venv_ver="" want_ver="" hash log

    venv_ver="$(_rt_py_version "$_rt_venv/bin/python")" || venv_ver=""
    if [[ -n "$venv_ver" && -n "${PYTHON:-}" ]]; then
        # An explicit $PYTHON wins: rebuild when the venv was made from another minor version.
        _rt_find_python || return 1
        want_ver="$(_rt_py_version "$_rt_python")"
        [[ "${want_ver%.*}" == "${venv_ver%.*}" ]] || venv_ver=""
    fi

    if [[ -z "$venv_ver" ]]; then
        if [[ -z "${_rt_python:-}" ]]; then
            _rt_find_python || return 1
        fi
        want_ver="$(_rt_py_version "$_rt_python")"
        if [[ -e "$_rt_venv" ]]; then
            _rt_say "recreating .venv (its Python is missing, broken, older than 3.12 or not \$PYTHON)"
            rm -rf "$_rt_venv"
        fi
        _rt_say "creating .venv with Python $want_ver ($_rt_python)"
        if ! "$_rt_python" -m venv "$_rt_venv"; then
            _rt_err "'$_rt_python -m venv $_rt_venv' failed"
            rm -rf "$_rt_venv"
            return 1
        fi
    fi

    hash="$(_rt_hash_pyproject "$_rt_lock")" || return 1
    if [[ ! -f "$_rt_stamp" || "$(cat "$_rt_stamp")" != "$hash" ]]; then
        _rt_install "$hash" || return 1
    fi
    return 0
}

# Prints pip's progress (each package it collects, then the install) while it runs.
_rt_progress() {
    local line count=0
    local -a names
    while IFS= read -r line; do
        case "$line" in
        Collecting\ *)
            count=$((count + 1))
            line="${line#Collecting }"
            printf '    [%3d] %s\n' "$count" "${line%% (from *}" >&2
            ;;
        Installing\ collected\ packages:*)
            IFS=', ' read -r -a names <<<"${line#*: }"
            printf '    installing %d package(s) into .venv ...\n' "${#names[@]}" >&2
            ;;
        esac
    done
}

_rt_install() {
    local hash="$1" log="$_rt_venv/pip-install.log" what="the project" status
    if [[ -n "$_rt_extras" ]]; then
        what="the project and its $_rt_extras tools"
    fi
    _rt_say "installing $what into .venv from ${_rt_lock#"$_rt_root"/} (the first time takes a minute or two)"
    rm -f "$_rt_stamp" # a failed or interrupted install is retried next time
    # --require-hashes: every package at its locked version and bytes; the project itself has no
    # dependencies left to resolve (--no-deps) and builds with the locked setuptools.
    (cd "$_rt_root" && "$_rt_venv/bin/python" -m pip install --disable-pip-version-check \
        --no-input --require-hashes --no-deps -r "$_rt_lock" &&
        "$_rt_venv/bin/python" -m pip install --disable-pip-version-check --no-input \
            --no-deps --no-build-isolation -e .) 2>&1 | tee "$log" | _rt_progress
    status="${PIPESTATUS[0]}"
    if [[ "$status" != 0 ]]; then
        _rt_err "installing from ${_rt_lock#"$_rt_root"/} failed; last lines of $log:"
        tail -n 40 "$log" >&2
        return 1
    fi
    echo "$hash" >"$_rt_stamp"
    if [[ -n "$_rt_extras" ]]; then
        # The test set holds the product's set: scripts/start need not install again.
        # (scripts/lock compiles start.txt within test.txt's versions.)
        _rt_hash_pyproject "$_rt_root/requirements/start.txt" >"$_rt_product_stamp"
    fi
    _rt_say "installed"
    return 0
}

# Serialise concurrent callers (two terminals, or start and test at once) on one lock file.
_rt_run_locked() {
    local status=0 lock_fd
    if command -v flock >/dev/null 2>&1 && mkdir -p "$_rt_root/var" 2>/dev/null &&
        exec {lock_fd}>"$_rt_root/var/.python-env.lock"; then
        flock "$lock_fd"
        _rt_ensure_env || status=$?
        exec {lock_fd}>&-
    else
        _rt_ensure_env || status=$?
    fi
    return "$status"
}

# scripts/lock needs only an interpreter, not the project's environment.
if [[ -n "${RT_FIND_PYTHON_ONLY:-}" ]]; then
    _rt_find_python || return 1
    return 0
fi

if ! _rt_run_locked; then
    unset _rt_python
    return 1
fi

export VIRTUAL_ENV="$_rt_venv"
export PATH="$_rt_venv/bin:$PATH"
unset PYTHONHOME _rt_python
hash -r
