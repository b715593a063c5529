#!/usr/bin/env bash
# End-to-end check of the chat on the real draft pair, in a real terminal (tmux, 100x30): start `specchat --model
# qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b` with the code preset drafting a fixed K 4 (a user preset: on a
# 2-core CPU adaptive K rightly leaves this draft off, and the check is about what the bar shows), ask a coding
# question, and check that while the reply streams the status bar shows a live acceptance figure and the draft
# model's name; then switch the draft to n-gram in the settings dialog (F12: the model reloads, the draft's name
# leaves the bar) and back to the draft model by name. Exits non-zero on failure and prints the captured screen.
#
#   tests/e2e/tmux_pair_e2e.sh            # uses .venv/bin/specchat; the pair is fetched first if needed
set -euo pipefail

NAME=tmux_pair_e2e
SIZE=100x30
SESSION="specchat-pair-e2e-$$"
POLL_S=0.2
LOAD_TIMEOUT="${E2E_LOAD_TIMEOUT:-600}"
REPLY_TIMEOUT="${E2E_REPLY_TIMEOUT:-300}"
DRAFT="qwen2.5-coder-0.5b"
# shellcheck source=tests/e2e/tmux_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/tmux_lib.sh"

mkdir -p "$WORK/config/specchat/presets"
printf 'k = 4\nk_mode = "fixed"\nmax_new_tokens = 40\n' > "$WORK/config/specchat/presets/code.toml"
start_specchat --model qwen2.5-coder-1.5b --draft "$DRAFT" --preset code --seed 7

wait_for "$LOAD_TIMEOUT" "the pair to load" eval 'ready || failed'
failed && fail "the pair did not load"
status_line | grep -q "draft $DRAFT" || fail "the status bar does not name the draft: $(status_line)"

tmux send-keys -t "$SESSION" -l "Write a Python function that checks whether a number is prime."
tmux send-keys -t "$SESSION" Enter
# Live: while the reply streams (●), an acceptance percentage and the draft's name on the bar.
live() { status_line | grep -qE "^ ● code .*draft $DRAFT.*accept [0-9]+%"; }
wait_for "$REPLY_TIMEOUT" "a live acceptance figure while the reply streams" live
live_line="$(status_line)"
answered() { ready && screen | grep -qE '[0-9]+ tok · '; }
wait_for "$REPLY_TIMEOUT" "the reply to finish" answered
status_line | grep -qE "accept [0-9]+%" || fail "no acceptance figure after the reply: $(status_line)"

set_draft() {
    tmux send-keys -t "$SESSION" F12
    settings() { screen | grep -q 'Settings for this chat'; }
    wait_for 5 "the settings dialog to open" settings
    tmux send-keys -t "$SESSION" BTab BTab
    sleep 0.5
    tmux send-keys -t "$SESSION" -l "$1"
    # A busy machine can take a while to draw the typed text: wait for it rather than sleep a fixed time.
    local want="$1"
    holds() { screen | grep -qE "│ draft +$want "; }
    wait_for 20 "the draft field to hold $1" holds
    tmux send-keys -t "$SESSION" C-s
}
set_draft ngram
ngram() { ready && status_line | grep -qE '^ ○ code │ K 4 │' && ! status_line | grep -q "draft $DRAFT"; }
wait_for "$LOAD_TIMEOUT" "the reload with n-gram drafting (the draft's name gone)" ngram
ngram_line="$(status_line)"
set_draft "$DRAFT"
back() { ready && status_line | grep -q "draft $DRAFT"; }
wait_for "$LOAD_TIMEOUT" "the reload with the draft model by name" back

echo "tmux_pair_e2e: OK: streaming: $live_line"
echo "tmux_pair_e2e: after F12 ngram: $ngram_line"
echo "tmux_pair_e2e: after F12 $DRAFT: $(status_line)"
echo "----- screen (100x30) -----"
screen
tmux send-keys -t "$SESSION" C-q
