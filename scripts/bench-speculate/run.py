"""Driver of scripts/bench-speculate.sh: runs `anelm generate` per prompt, alternating plain and
lookup decoding, and prints a Markdown table (see the shell script)."""

import json
import os
import re
import statistics
import subprocess
import sys

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


def main():
    binary, model, rounds, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    extra = sys.argv[6:]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "prompts.json")) as f:
        prompts = json.load(f)
    print(f"model {os.path.basename(model)}, {rounds} rounds, up to {tokens} tokens, {threads} threads, greedy")
    print()
    print("| prompt | tokens | plain tok/s | lookup tok/s | × | accepted | tokens/pass |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for p in prompts:
        plain, fast = [], []
        for r in range(rounds):
            plain.append(run(binary, model, p["prompt"], tokens, threads, "off", extra))
            fast.append(run(binary, model, p["prompt"], tokens, threads, "lookup", extra))
            if fast[-1]["text"] != plain[-1]["text"]:
                sys.exit(f"{p['kind']}: the lookup text differs from the plain one:\n"
                         f"--- plain\n{plain[-1]['text']}\n--- lookup\n{fast[-1]['text']}")
            print(f"{p['kind']} round {r + 1}/{rounds}: {plain[-1]['tok_s']} {fast[-1]['tok_s']}", file=sys.stderr)
        a = [x["tok_s"] for x in plain]
        b = [x["tok_s"] for x in fast]
        ratio = statistics.median(b) / statistics.median(a)
        ratios.append(ratio)
        f0 = fast[0]
        acc = f"{100 * f0['accepted'] / f0['drafted']:.0f} % of {f0['drafted']}" if f0.get("drafted") else "nothing drafted"
        print(f"| {p['kind']} | {f0['tokens']} | {span(a)} | {span(b)} | {ratio:.2f} | {acc} | {f0.get('per_pass', 1.0):.2f} |")
    print()
    print(f"median ratio over the prompts: {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
          "greedy texts identical in every round")


if __name__ == "__main__":
    main()
