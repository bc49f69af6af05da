#!/usr/bin/env python3
"""Recall of an early fact through a long llama-server session, per eviction method.

For each method (and the full cache, no budget) and each fact: start the fork's llama-server
(a fresh one per session, so no session inherits another's cells), tell it the fact in the
first turn, talk about TURNS other topics over /v1/chat/completions (answers fed back as the
history, as a chat client does), then ask about the fact; the fact survives when the last
answer contains its key word. Prints one line per session and a summary table.

    llama_fork/server_recall.py --bin BUILD/bin --model SmolLM2-135M-Instruct.Q4_1.gguf \
        [--budget 256] [--turns 20] [--max-tokens 32] [--methods full,laprox-span,...]

A method may carry the fork's flags: "uniqueness+--kv-evict-links=0.5+--kv-mark-prompts".

Standard library only; run with any python3.
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

FACTS = [
    ("My name is Alice and my favourite colour is green. Please remember that.",
     "What is my favourite colour?", "green"),
    ("The secret code word is pineapple. Please remember it.",
     "What is the secret code word?", "pineapple"),
    ("My dog is called Biscuit. Please remember his name.",
     "What is my dog called?", "biscuit"),
    ("I live in the city of Lisbon. Please remember where I live.",
     "Which city do I live in?", "lisbon"),
    ("My lucky number is 47. Please remember it.",
     "What is my lucky number?", "47"),
]
TOPICS = ["the moon", "rivers", "bread", "owls", "glaciers", "violins", "deserts", "bees",
          "lighthouses", "tea", "volcanoes", "chess", "maps", "whales", "clocks", "forests",
          "bridges", "salt", "comets", "gardens", "kites", "pianos", "islands", "candles"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def session(args, method, fact):
    port = free_port()
    cmd = [os.path.join(args.bin, "llama-server"), "-m", args.model, "--host", "127.0.0.1",
           "--port", str(port), "-c", "4096", "-np", "1", "-t", str(args.threads), "-lv", "4"]
    # llama-server's default -b 2048 -ub 512: under the budget n_ubatch is capped to what an eviction frees
    # a method "NAME+FLAG[=VALUE]+...": the fork's flags after it, e.g. "uniqueness+--kv-evict-links=0.5+--kv-mark-prompts"
    name, *flags = method.split("+")
    if name != "full":
        cmd += ["--kv-evict", name, "--kv-max-cells", str(args.budget), "--kv-evict-to", "0.75"]
        for f in flags:
            cmd += f.split("=", 1)
    log = tempfile.NamedTemporaryFile("w+", prefix="kvevict-recall-", suffix=".log", delete=False)
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        while True:
            try:
                if request(port, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if srv.poll() is not None or time.time() - t0 > 300:
                raise RuntimeError("llama-server did not come up: " + open(log.name).read()[-2000:])
            time.sleep(0.5)
        said, question, key = fact
        messages = [{"role": "user", "content": said}]
        errors, prompt_tokens = 0, 0

        def turn():
            nonlocal errors, prompt_tokens
            status, data = request(port, "POST", "/v1/chat/completions", {
                "messages": messages, "max_tokens": args.max_tokens, "temperature": 0})
            if status != 200:
                errors += 1
                return ""
            out = json.loads(data)
            prompt_tokens = out.get("usage", {}).get("prompt_tokens", prompt_tokens)
            return out["choices"][0]["message"]["content"] or ""

        messages.append({"role": "assistant", "content": turn()})
        for t in TOPICS[:args.turns]:
            messages.append({"role": "user", "content": f"Tell me two facts about {t}, in two sentences."})
            messages.append({"role": "assistant", "content": turn()})
        messages.append({"role": "user", "content": question})
        last = turn()
        text = open(log.name).read()
        held = [int(m) for m in re.findall(r"most cells held (\d+)", text)]
        evictions = re.findall(r"evict: seq \d+: \d+ -> \d+ cells", text)
        alloc = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells", text)
        return {"method": method, "key": key, "recalled": key in last.lower(), "answer": last,
                "errors": errors, "history": prompt_tokens, "evictions": len(evictions),
                "most_cells": max(held) if held else None,
                "kv_cells": int(alloc.group(2)) if alloc else None,
                "kv_mib": float(alloc.group(1)) if alloc else None, "secs": time.time() - t0}
    finally:
        srv.terminate()
        srv.wait()
        log.close()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--facts", type=int, default=len(FACTS))
    ap.add_argument("--methods", default="full,laprox-span,uniqueness,streamingllm")
    args = ap.parse_args()
    summary = {}
    for method in args.methods.split(","):
        for fact in FACTS[:args.facts]:
            r = session(args, method, fact)
            print(json.dumps(r), flush=True)
            s = summary.setdefault(method, [0, 0, 0])
            s[0] += r["recalled"]
            s[1] += 1
            s[2] += r["errors"]
    print("| method | fact recalled | errors |\n|---|---:|---:|")
    for m, (ok, n, err) in summary.items():
        print(f"| {m} | {ok}/{n} | {err} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
