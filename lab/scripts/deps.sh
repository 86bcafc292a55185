#!/usr/bin/env bash
# Install what `make build` needs on a fresh Debian machine, quietly and
# idempotently: apt packages only when a command or file is missing (one
# `apt-get update`, only if something must be installed). Rust must already be
# there (cargo from rustup); the lab's virtualenv is made by the Makefile.
set -euo pipefail

PYTHON=${PYTHON:-python3}
need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if command -v "$PYTHON" >/dev/null 2>&1; then
    # Debian splits venv/ensurepip out of python3 into python3-venv.
    "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
else
    need+=(python3 python3-venv)
fi

# The real Tor as the lab's baseline peer (`chive-lab up --impl tor`, issue 5)
# and iperf3 for plain-TCP reference runs. Optional: if they cannot be
# installed, `make build` still succeeds and the tor tests skip with the reason.
optional=()
# Debian installs tor in /usr/sbin, which a non-root PATH may lack.
if ! command -v tor >/dev/null 2>&1 && [ ! -x /usr/sbin/tor ] || ! command -v tor-gencert >/dev/null 2>&1; then
    optional+=(tor)
fi
command -v iperf3 >/dev/null 2>&1 || optional+=(iperf3)

if [ ${#need[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "deps: missing ${need[*]} and no apt-get to install them; install them by hand" >&2
        exit 1
    fi
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "deps: installing ${need[*]} with apt-get" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ${#optional[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "deps: ${optional[*]} not installed and no apt-get: the tor baseline (--impl tor) is unavailable" >&2
    else
        sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
        echo "deps: installing ${optional[*]} with apt-get (the tor baseline)" >&2
        # Debian's tor package would start a system tor service where services
        # run; the lab never uses it (it runs its own tor processes).
        if ! { $sudo apt-get update -qq &&
               DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
                   "${optional[@]}" >/dev/null; }; then
            echo "deps: could not install ${optional[*]}: the tor baseline (--impl tor) is unavailable" \
                 "and its tests will be skipped" >&2
        fi
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "deps: cargo not found: install Rust with rustup and put ~/.cargo/bin on PATH" >&2
    exit 1
fi
