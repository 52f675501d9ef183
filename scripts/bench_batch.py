"""What background work costs the person at the keyboard, and what the prompt cache saves
(issue 35's benchmarks; run by scripts/bench-batch.sh, which builds anelm and sets up Python).

Usage: python bench_batch.py ANELM MODEL [--sessions 4] [--lines 32] [--tokens 64] [--rounds 3]
                             [--system-words 900] [--json-out FILE]

1. Priority: the time to first token of an interactive streaming request on an idle server, and
   while a batch fills every session (target: <= 1.5x idle).
2. Throughput: a batch of LINES requests through the Batch API against the same requests sent
   by a client at full concurrency (--sessions at once) (target: >= 0.9x). The two alternate in
   each round; the TTFT of (1) is measured during a third batch of each round.
3. Prompt cache: time to first token of a request with a long shared system prompt: cold (new
   data directory), warm (the same system prompt again in the same process), after a restart
   with the prompt cache, and after a restart without it.
Prints medians with [min, max] over the rounds.
"""
import argparse
import concurrent.futures
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("anelm")
ap.add_argument("model")
ap.add_argument("--sessions", type=int, default=4)
ap.add_argument("--lines", type=int, default=32)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--system-words", type=int, default=900)
ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
ap.add_argument("--json-out")
args = ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir, extra=()):
        self.port = free_port()
        cmd = [args.anelm, "serve", "--model", args.model, "--port", str(self.port), "-t", str(args.threads),
               "--sessions", str(args.sessions), "--data-dir", data_dir, "--ctx-size", "4096", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        t = time.time()
        while True:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.time() - t > 300:
                raise SystemExit("the server did not become healthy in 300 s")
            time.sleep(0.1)
        self.client = OpenAI(base_url=self.base + "/v1", api_key="x", max_retries=0, timeout=600)

    def metric(self, name):
        with urllib.request.urlopen(self.base + "/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f"anelm_{name} "):
                    return float(line.split()[1])
        return 0.0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ttft(client, messages, max_tokens=8):
    t = time.perf_counter()
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t
    return first if first is not None else time.perf_counter() - t


def line_body(i):
    return {"messages": [{"role": "user", "content": f"Summarise note {i}: the meeting about the garden moved to Tuesday."}],
            "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True}


def run_batch(server):
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": line_body(i)}
             for i in range(args.lines)]
    data = ("\n".join(json.dumps(l) for l in lines) + "\n").encode()
    f = server.client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")
    t = time.perf_counter()
    b = server.client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    return b.id, t


def wait_batch(server, batch_id):
    while True:
        b = server.client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "cancelled", "expired"):
            assert b.status == "completed", b
            return time.perf_counter()
        time.sleep(0.05)


def client_side(server):
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.sessions) as ex:
        def one(i):
            body = line_body(i)
            body.pop("ignore_eos")
            return server.client.chat.completions.create(model="m", **body, extra_body={"ignore_eos": True})
        list(ex.map(one, range(args.lines)))
    return time.perf_counter() - t


def stats(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}


def fmt(s, unit="s"):
    return f"{s['median']:.3f} {unit} [{s['min']:.3f}, {s['max']:.3f}]"


results = {"model": os.path.basename(args.model), "sessions": args.sessions, "lines": args.lines,
           "tokens": args.tokens, "threads": args.threads}
ASK = [0]


def short():
    """An interactive question of ~60 tokens, new each time (no cache holds it)."""
    ASK[0] += 1
    return [{"role": "user", "content": f"Question {ASK[0]}: I keep my notes in folders by topic, one per "
             "project, and a journal. Which folder should a note about a dentist appointment on "
             f"day {ASK[0]} of the month go in? Answer in one word."}]

# --- 1 and 2: priority and throughput ----------------------------------------------------------
work = tempfile.mkdtemp(prefix="anelm-bench-batch-")
try:
    srv = Server(os.path.join(work, "d"), ["--no-prompt-cache"])
    ttft(srv.client, short())  # warm-up
    idle, busy, batch_s, client_s = [], [], [], []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        for _ in range(3):
            idle.append(ttft(srv.client, short()))
        order = ["batch", "client"] if r % 2 == 0 else ["client", "batch"]
        for what in order:
            if what == "client":
                client_s.append(client_side(srv))
            else:
                bid, t0 = run_batch(srv)
                batch_s.append(wait_batch(srv, bid) - t0)
        # A third batch, for the interactive requests' TTFT while it fills every session (its
        # time is not a throughput figure: the interactive requests take some of it).
        bid, _ = run_batch(srv)
        while srv.metric("busy_sessions") < args.sessions:
            time.sleep(0.01)
        for _ in range(3):
            busy.append(ttft(srv.client, short()))
            time.sleep(0.2)
        wait_batch(srv, bid)
    srv.stop()
    results["ttft_idle_s"], results["ttft_during_batch_s"] = stats(idle), stats(busy)
    results["batch_s"], results["client_s"] = stats(batch_s), stats(client_s)
    ratio_ttft = results["ttft_during_batch_s"]["median"] / results["ttft_idle_s"]["median"]
    ratio_tp = results["client_s"]["median"] / results["batch_s"]["median"]
    results["ttft_ratio"], results["throughput_ratio"] = ratio_ttft, ratio_tp

    # --- 3: prompt cache ---------------------------------------------------------------------
    system = " ".join(f"Rule {i}: notes about topic {i} go to folder {i % 13} unless marked urgent."
                      for i in range(args.system_words // 12))
    msgs = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]
    cold, warm, restart, restart_off = [], [], [], []
    for r in range(args.rounds):
        d = os.path.join(work, f"pc{r}")
        s = Server(d)
        cold.append(ttft(s.client, msgs("Where does a note about bees go?")))
        warm.append(ttft(s.client, msgs("Where does a note about taxes go?")))
        t = time.time()
        while s.metric("prompt_cache_entries") < 1 and time.time() - t < 30:
            time.sleep(0.05)
        s.stop()
        s = Server(d)
        restart.append(ttft(s.client, msgs("Where does a note about chess go?")))
        assert s.metric("prompt_cache_hits_total") >= 1, "the prompt cache was not used after the restart"
        s.stop()
        s = Server(d, ["--no-prompt-cache"])
        restart_off.append(ttft(s.client, msgs("Where does a note about chess go?")))
        s.stop()
    results["prompt_cache_ttft_s"] = {"cold": stats(cold), "warm_in_memory": stats(warm),
                                      "after_restart": stats(restart),
                                      "after_restart_without_cache": stats(restart_off)}
finally:
    shutil.rmtree(work, ignore_errors=True)

print(f"model {results['model']}, {args.sessions} sessions, {args.threads} threads, "
      f"{args.lines} lines x {args.tokens} tokens, {args.rounds} rounds (median [min, max])")
print(f"interactive TTFT idle          {fmt(results['ttft_idle_s'])}")
print(f"interactive TTFT during batch  {fmt(results['ttft_during_batch_s'])}  ratio {ratio_ttft:.2f} (target <= 1.5)")
print(f"batch through the Batch API    {fmt(results['batch_s'])}")
print(f"same lines, client at c={args.sessions}   {fmt(results['client_s'])}  throughput ratio {ratio_tp:.2f} (target >= 0.9)")
pc = results["prompt_cache_ttft_s"]
print(f"long shared system prompt ({args.system_words} words) TTFT:")
for k, v in pc.items():
    print(f"  {k:<28} {fmt(v)}")
if args.json_out:
    with open(args.json_out, "w") as f:
        json.dump(results, f, indent=1)
