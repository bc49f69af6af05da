#!/usr/bin/env python3
"""The needle through llama-server's chat path (/v1/chat/completions, the chat template included).

For each configuration (a set of llama-server flags; "full": none) one server is started and,
per seed, a needle context of about --sentences sentences (a pass key at a seed-chosen depth
among generated filler) is asked about in one of two shapes:

  one       one user message: the context, then the question last (question-aware eviction)
  two       the context in turn 1 (the model answers it), the question in turn 2 (the context is
            compressed before the question exists: question-agnostic)

Each request of shape "one" is sent with cache_prompt false (no cells kept from the previous
seed); each conversation of shape "two" first clears the slot with a short unrelated request.
A seed counts when the answer contains the key. Prints one JSON line per (config, seed) and a
table: keys recovered, and of those the full cache recovers. Failed evictions in the server's
log are counted too.

    llama_fork/chat_needle.py --bin BUILD/bin --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --shape one --seeds 1-10 \
        --config full= --config 'keep=--kv-evict laprox-span --kv-keep 0.1'

Standard library only.
"""
import argparse
import ast
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from server_recall import free_port, request  # (same folder)

def _grammar():
    """eval/needle.py's filler grammar (SUBJECTS, VERBS, OBJECTS, TAILS, SHORT), read from its source
    (it imports numpy; this script needs the standard library only)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval", "needle.py")
    names = {"SUBJECTS", "VERBS", "OBJECTS", "TAILS", "SHORT"}
    out = {}
    for node in ast.parse(open(src).read()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in names:
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out["SUBJECTS"], out["VERBS"], out["OBJECTS"], out["TAILS"], out["SHORT"]


SUBJECTS, VERBS, OBJECTS, TAILS, SHORT = _grammar()


def needle(seed, sentences):
    """(context, key): filler sentences with 'The pass key is K. Remember it.' at a seed-chosen
    depth (between 20 % and 80 %); splitmix64 on the seed, so every seed is another text."""
    state = (0x6b76657669637400 ^ (seed * 0x100000001b3)) & (2**64 - 1)

    def pick(n):
        nonlocal state
        state = (state + 0x9e3779b97f4a7c15) & (2**64 - 1)
        z = state
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & (2**64 - 1)
        return (z ^ (z >> 31)) % n

    key = str(10000 + pick(90000))
    sents = []
    for _ in range(sentences):
        if pick(5) == 0:
            sents.append(SHORT[pick(8)])
        else:
            sents.append(f"{SUBJECTS[pick(16)]} {VERBS[pick(16)]} {OBJECTS[pick(16)]} {TAILS[pick(12)]}.")
    depth = sentences // 5 + pick(3 * sentences // 5 + 1)
    sents.insert(depth, f"The pass key is {key}. Remember it.")
    return " ".join(sents), key


QUESTION = "What is the pass key? Answer with the number only."


def chat(port, messages, max_tokens, cache_prompt=True):
    status, data = request(port, "POST", "/v1/chat/completions", {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "cache_prompt": cache_prompt})
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
    out = json.loads(data)
    return out["choices"][0]["message"]["content"] or "", out.get("usage", {}).get("prompt_tokens", 0)


def start(args, flags, log):
    port = free_port()
    cmd = [os.path.join(args.bin, "llama-server"), "-m", args.model, "--host", "127.0.0.1",
           "--port", str(port), "-c", str(args.ctx), "-np", "1", "-t", str(args.threads)] + flags
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    while True:
        try:
            if request(port, "GET", "/health", timeout=5)[0] == 200:
                return srv, port
        except OSError:
            pass
        if srv.poll() is not None or time.time() - t0 > 300:
            raise RuntimeError("llama-server did not come up: " + open(log.name).read()[-2000:])
        time.sleep(0.5)


def run_config(args, name, flags, seeds):
    log = tempfile.NamedTemporaryFile("w+", prefix="kvevict-chat-needle-", suffix=".log", delete=False)
    srv, port = start(args, flags, log)
    rows = []
    try:
        for seed in seeds:
            ctx, key = needle(seed, args.sentences)
            t0 = time.time()
            if args.shape == "one":
                msgs = [{"role": "user", "content": ctx + "\n\n" + args.question}]
                answer, prompt = chat(port, msgs, args.max_tokens, cache_prompt=False)
            else:
                chat(port, [{"role": "user", "content": "Hello."}], 4, cache_prompt=False)
                msgs = [{"role": "user", "content": args.intro + ctx}]
                reply, _ = chat(port, msgs, args.reply_tokens)
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": args.question}]
                answer, prompt = chat(port, msgs, args.max_tokens)
            rows.append({"config": name, "seed": seed, "key": key, "ok": key in answer,
                         "answer": answer.strip()[:80], "prompt_tokens": prompt,
                         "secs": round(time.time() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        srv.terminate()
        srv.wait()
        text = open(log.name).read()
        log.close()
        os.unlink(log.name)
    failures = len(re.findall(r"eviction of seq \d+ failed|KV eviction needs|KV eviction cannot", text))
    evictions = re.findall(r"kv eviction: seq \d+: (\d+) -> (\d+) cells", text)
    return rows, failures, evictions


def parse_seeds(s):
    out = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--shape", choices=["one", "two"], default="one")
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--sentences", type=int, default=120, help="filler sentences (~12 tokens each)")
    ap.add_argument("--config", action="append", default=[],
                    help="NAME=FLAGS (llama-server flags, split on spaces); 'full=' for no eviction")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--intro", default="", help="shape two: text before the context in turn 1 (it must not "
                    "name what will be asked: the eviction stays question-agnostic)")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    results = {}
    for c in args.config or ["full="]:
        name, _, flags = c.partition("=")
        rows, failures, evictions = run_config(args, name, flags.split(), seeds)
        results[name] = (rows, failures, evictions)
    full = {r["seed"] for r in results["full"][0] if r["ok"]} if "full" in results else None
    print(f"\nshape {args.shape}, seeds {args.seeds}, {args.sentences} filler sentences, "
          f"intro {args.intro!r}, question {args.question!r}")
    print("| config | keys recovered | of the full cache's | failed evictions | evictions (first: cells before -> after) |")
    print("|---|---:|---:|---:|---|")
    for name, (rows, failures, ev) in results.items():
        ok = {r["seed"] for r in rows if r["ok"]}
        of_full = f"{len(ok & full)}/{len(full)}" if full is not None else "-"
        first = f"{ev[0][0]} -> {ev[0][1]}" if ev else ""
        print(f"| {name} | {len(ok)}/{len(rows)} | {of_full} | {failures} | {len(ev)} ({first}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
