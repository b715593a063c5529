# Shared by the tmux end-to-end checks (tests/e2e/tmux_e2e.sh, tests/e2e/tmux_pair_e2e.sh). Source it after setting
# NAME (the check's name in messages), SIZE (COLSxROWS) and SESSION; it checks tmux and specchat are there, makes
# WORK (private config and data folders, removed on exit) and defines the helpers below. It starts nothing.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPECCHAT="${SPECCHAT:-$ROOT/.venv/bin/specchat}"
POLL_S="${POLL_S:-0.5}"
WORK="$(mktemp -d)"

command -v tmux >/dev/null || { echo "$NAME: tmux is not installed" >&2; exit 2; }
[ -x "$SPECCHAT" ] || { echo "$NAME: $SPECCHAT not found (run make install)" >&2; exit 2; }

# Every tmux command talks to a server of this check's own (-L SESSION), which it starts and stops: a session's
# programs are the server's children and keep the CPU affinity of whoever started the server. Under `make test` (each
# worker pinned to a core) specchat in another worker's server ran on that worker's core, beside its tests, and in
# the server of a terminal `make test` ran in, on every core (two llama.cpp threads on two busy cores).
tmux() { command tmux -L "$SESSION" "$@"; }

cleanup() {
    tmux kill-server 2>/dev/null || true
    rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$SESSION"  # the server's socket
    rm -rf "$WORK"
}
trap cleanup EXIT

screen() { tmux capture-pane -p -t "$SESSION" 2>/dev/null || true; }
status_line() { screen | grep -E '^ [○●◌✖] ' | tail -n 1; }
ready() { status_line | grep -q '^ ○ '; }
failed() { status_line | grep -q '^ ✖ '; }

fail() {
    echo "$NAME: FAIL: $*" >&2
    echo "----- screen ($SIZE) -----" >&2
    screen >&2
    echo "----- end of screen -----" >&2
    exit 1
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every POLL_S seconds.
wait_for() {
    local seconds="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        if ((SECONDS >= deadline)); then fail "timed out after ${seconds}s waiting for $what"; fi
        screen | grep -q 'specchat exited with status' && fail "specchat exited while waiting for $what"
        sleep "$POLL_S"
    done
}

# start_specchat ARGS...: specchat in a detached tmux session of SIZE, with WORK's config and data folders (no
# user keymap or presets; the model cache stays shared). Textual draws on stderr, so nothing is redirected: a
# crash leaves its message on the captured screen.
start_specchat() {
    mkdir -p "$WORK/config" "$WORK/data"
    tmux new-session -d -s "$SESSION" -x "${SIZE%x*}" -y "${SIZE#*x}" \
        "env XDG_CONFIG_HOME='$WORK/config' XDG_DATA_HOME='$WORK/data' TERM=xterm-256color '$SPECCHAT' $*; echo \"specchat exited with status \$?\"; sleep 600"
}

# paste_text TEXT: paste TEXT (printf %b escapes: \n, \033) the way a terminal pastes into an app that asked for
# bracketed paste, as specchat does: between ESC[200~ and ESC[201~, line breaks as CR (tmux paste-buffer -p).
paste_text() {
    printf '%b' "$1" >"$WORK/paste.txt"
    tmux load-buffer -b "paste-$SESSION" "$WORK/paste.txt"
    tmux paste-buffer -p -d -b "paste-$SESSION" -t "$SESSION"
}
