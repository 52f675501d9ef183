"""Driver of scripts/bench-speculate.sh: runs `anelm generate` per prompt, alternating plain and
lookup decoding, and prints a Markdown table (see the shell script)."""

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

GEN = re.compile(r"generation: (\d+) tokens, ([0-9.]+) tok/s")
SPEC = re.compile(r"speculation: (\d+) passes, ([0-9.]+) tokens per pass, (\d+) of (\d+) drafted")


def run(binary, model, prompt, tokens, threads, mode, extra):
    cmd = [binary, "generate", "--model", model, "-t", str(threads), "--temp", "0", "-n", str(tokens),
           "--speculate", mode, *extra, prompt]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"anelm generate failed ({p.returncode}):\n{p.stderr}")
    g = GEN.search(p.stderr)
    if not g:
        sys.exit(f"no generation figures in:\n{p.stderr}")
    out = {"text": p.stdout, "tokens": int(g.group(1)), "tok_s": float(g.group(2))}
    s = SPEC.search(p.stderr)
    if s:
        out.update(passes=int(s.group(1)), per_pass=float(s.group(2)), accepted=int(s.group(3)),
                   drafted=int(s.group(4)))
    return out


def span(xs):
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"


def serve(binary, model, threads):
    """Start `anelm serve` on a free port; returns (process, base URL) once it is healthy."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "-t", str(threads),
                             "--sessions", "1", "--no-data-dir"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    start = time.time()
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except Exception:
            pass
        if proc.poll() is not None or time.time() - start > 300:
            sys.exit("anelm serve did not become healthy")
        time.sleep(0.1)


def chat(base, prompt, tokens, mode):
    """One streamed greedy chat request with `speculate: mode`: text, tokens, tokens/s from the
    first content chunk to the last."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": int(tokens), "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "speculate": mode}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, first, last, n = "", None, None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content") or ""
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text += piece
    rate = (n - 1) / (last - first) if first and last and last > first else 0.0
    return {"text": text, "tokens": n, "tok_s": rate}


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"anelm_{name} "):
                return float(line.split()[1])
    return 0.0


def alternate(prompts, rounds, plain_run, lookup_run):
    """Per prompt, `rounds` pairs of runs (plain, then lookup), failing if a pair's texts differ;
    yields (prompt, plain results, lookup results, ratio of the median tok/s)."""
    for p in prompts:
        plain, fast = [], []
        for r in range(rounds):
            plain.append(plain_run(p["prompt"]))
            fast.append(lookup_run(p["prompt"]))
            if fast[-1]["text"] != plain[-1]["text"]:
                sys.exit(f"{p['kind']}: the lookup text differs from the plain one:\n"
                         f"--- plain\n{plain[-1]['text']}\n--- lookup\n{fast[-1]['text']}")
            print(f"{p['kind']} round {r + 1}/{rounds}: {plain[-1]['tok_s']} {fast[-1]['tok_s']}", file=sys.stderr)
        a = [x["tok_s"] for x in plain]
        b = [x["tok_s"] for x in fast]
        yield p, plain, fast, statistics.median(b) / statistics.median(a)


def main_server(binary, model, rounds, tokens, threads, prompts):
    """The same prompts through `anelm serve`, each request choosing `speculate` off or lookup."""
    proc, base = serve(binary, model, threads)
    try:
        print(f"server: model {os.path.basename(model)}, {rounds} rounds, up to {tokens} tokens, {threads} threads, "
              "greedy, one session, streamed")
        print()
        print("| prompt | tokens | plain tok/s | lookup tok/s | × |")
        print("| --- | ---: | ---: | ---: | ---: |")
        ratios = []
        for p, plain, fast, ratio in alternate(prompts, rounds, lambda text: chat(base, text, tokens, "off"),
                                               lambda text: chat(base, text, tokens, "lookup")):
            ratios.append(ratio)
            a = [x["tok_s"] for x in plain]
            b = [x["tok_s"] for x in fast]
            print(f"| {p['kind']} | {plain[0]['tokens']} | {span(a)} | {span(b)} | {ratio:.2f} |")
        drafted, accepted = metric(base, "draft_tokens_total"), metric(base, "draft_accepted_total")
        passes, generated = metric(base, "decode_passes_total"), metric(base, "generated_tokens_total")
        print()
        print(f"median ratio over the prompts: {statistics.median(ratios):.2f}; /metrics: {accepted:.0f} of "
              f"{drafted:.0f} drafted tokens accepted, {generated:.0f} tokens in {passes:.0f} decode passes "
              "(plain requests included); texts identical in every round")
    finally:
        proc.terminate()
        proc.wait()


def main():
    binary, model, rounds, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    extra = sys.argv[6:]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "prompts.json")) as f:
        prompts = json.load(f)
    if extra[:1] == ["--server"]:
        return main_server(binary, model, rounds, tokens, threads, prompts)
    print(f"model {os.path.basename(model)}, {rounds} rounds, up to {tokens} tokens, {threads} threads, greedy")
    print()
    print("| prompt | tokens | plain tok/s | lookup tok/s | × | accepted | tokens/pass |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for p, plain, fast, ratio in alternate(prompts, rounds,
                                           lambda text: run(binary, model, text, tokens, threads, "off", extra),
                                           lambda text: run(binary, model, text, tokens, threads, "lookup", extra)):
        ratios.append(ratio)
        a = [x["tok_s"] for x in plain]
        b = [x["tok_s"] for x in fast]
        f0 = fast[0]
        acc = f"{100 * f0['accepted'] / f0['drafted']:.0f} % of {f0['drafted']}" if f0.get("drafted") else "nothing drafted"
        print(f"| {p['kind']} | {f0['tokens']} | {span(a)} | {span(b)} | {ratio:.2f} | {acc} | {f0.get('per_pass', 1.0):.2f} |")
    print()
    print(f"median ratio over the prompts: {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
          "greedy texts identical in every round")


if __name__ == "__main__":
    main()
