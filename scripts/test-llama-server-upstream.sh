#!/usr/bin/env bash
# anelm in front of a real llama.cpp `llama-server` (built from the source vendored in
# llama-cpp-python==0.3.36, cached like llama-bench): the official openai client streams through
# `anelm serve --upstream llama=...` and gets llama-server's own answer; a private request never
# reaches it (its token counters do not move); a killed llama-server gives a 502 while anelm keeps
# answering locally. Not part of CI (building llama-server takes minutes): CI runs the same
# checks against a second `anelm serve` (crates/anelm-cli/tests/upstream.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/llama-cpp.sh
. scripts/lib/llama-cpp.sh
SERVER="$LLAMA_CPP_BUILD/bin/llama-server"
[[ -x "$SERVER" ]] || llama_cpp_build llama-server
MODEL="$(scripts/fetch-default-model.sh | tail -n 1)"
PY="$(scripts/setup-test-env.sh | tail -n 1)"
cargo build --release -q -p anelm-cli
ANELM=target/release/anelm
LP=18461
AP=18462
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "nothing healthy on $1" >&2; exit 1; }
"$SERVER" -m "$MODEL" --port "$LP" -t 2 -c 2048 --metrics >/dev/null 2>&1 &
pids+=($!)
LLAMA_PID=$!
wait_up "$LP"
"$ANELM" serve --port "$AP" --sessions 2 --upstream "llama=http://127.0.0.1:$LP/v1" >/dev/null 2>&1 &
pids+=($!)
wait_up "$AP"
"$PY" - "$LP" "$AP" <<'PYEOF'
import json, sys, urllib.request
from openai import OpenAI, APIStatusError
lp, ap = sys.argv[1:3]
direct = OpenAI(base_url=f"http://127.0.0.1:{lp}/v1", api_key="x", max_retries=0)
front = OpenAI(base_url=f"http://127.0.0.1:{ap}/v1", api_key="x", max_retries=0)
msgs = [{"role": "user", "content": "Name three rivers."}]
want = direct.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0).choices[0].message.content
got = "".join(c.choices[0].delta.content or "" for c in front.chat.completions.create(
    model="llama", messages=msgs, max_tokens=16, temperature=0, stream=True) if c.choices)
assert got == want, (got, want)
print(f"ok: streamed through anelm = llama-server's answer: {got!r}")
def predicted():
    text = urllib.request.urlopen(f"http://127.0.0.1:{lp}/metrics").read().decode()
    return float(next(l.split()[-1] for l in text.splitlines() if l.startswith("llamacpp:tokens_predicted_total")))
before = predicted()
try:
    front.chat.completions.create(model="llama", messages=msgs, max_tokens=8,
                                  extra_headers={"X-Anelm-Privacy": "local"})
    raise SystemExit("a private request was forwarded")
except APIStatusError as e:
    assert e.status_code == 403, e
assert predicted() == before, "llama-server processed a private request"
print("ok: the private request never reached llama-server")
PYEOF
kill "$LLAMA_PID"; wait "$LLAMA_PID" 2>/dev/null || true
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$AP/v1/chat/completions" \
  -d '{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":4}')
[[ "$code" == 502 ]] || { echo "a dead llama-server gave $code, not 502" >&2; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$AP/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}')
[[ "$code" == 200 ]] || { echo "anelm's local answer failed ($code) with the upstream dead" >&2; exit 1; }
echo "ok: a dead llama-server is a 502; anelm keeps answering locally"
