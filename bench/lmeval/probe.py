#!/usr/bin/env python3
"""Checks an Ember HTTP door against what lm-evaluation-harness's
`local-completions` model sends and reads (lm_eval 0.4.13,
lm_eval/models/openai_completions.py and api_models.py). Standard library
only, so bench/run_lmeval.sh's dry run needs no venv.

    python3 bench/lmeval/probe.py --base http://127.0.0.1:PORT [--api-key K]
        [--require-echo] [--json OUT.json]

What it does, printing one line per check:
- GET /health until 200 (60 s);
- GET /v1/models: the served model id and max_model_len;
- GET /tokenizer_info (lm_eval's `tokenizer_backend=auto` probe) and
  POST /tokenize {"prompt": "test", "add_special_tokens": false}, as lm_eval
  does before choosing its remote tokenizer; POST /detokenize round trip;
- the first task item's loglikelihood request exactly as lm_eval sends it:
  {"model", "prompt", "temperature": 0, "max_tokens": 1, "logprobs": 1,
   "seed": 1234, "echo": true}, parsed as lm_eval parses it:
  choices sorted by "index"; per choice logprobs.token_logprobs[ctxlen:-1]
  (summed) and logprobs.top_logprobs[ctxlen:-1] (dicts token -> logprob;
  the choice is greedy when each token's logprob equals the max of its dict),
  with ctxlen the context's token count (from /tokenize here).
  A refusal is reported; with --require-echo it fails the probe.
Exit status 0 when every required check passed.
"""

import argparse
import json
import pathlib
import sys
import time
import urllib.error
import urllib.request

TASK = pathlib.Path(__file__).with_name("ember_mc.jsonl")


def call(base, path, body=None, key=None, timeout=60):
    """(status, parsed JSON body or text) of GET (body None) or POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_healthy(base, limit_s=60.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if call(base, "/health", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def loglikelihood(base, key, model, context, continuation):
    """lm_eval's request for one (context, continuation), parsed its way."""
    status, ctx = call(base, "/tokenize", {"prompt": context, "add_special_tokens": False}, key)
    if status != 200:
        return {"ok": False, "why": f"/tokenize {status}: {ctx}"}
    ctxlen = len(ctx["tokens"])
    payload = {
        "model": model,
        "prompt": context + continuation,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    status, out = call(base, "/v1/completions", payload, key)
    if status != 200:
        return {"ok": False, "why": f"/v1/completions {status}: {out}", "request": payload}
    try:
        choice = sorted(out["choices"], key=lambda c: c["index"])[0]
        token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(t == max(top.values()) for t, top in zip(token_logprobs, top_logprobs))
        return {
            "ok": True,
            "ctxlen": ctxlen,
            "entries": len(choice["logprobs"]["token_logprobs"]),
            "loglikelihood": sum(token_logprobs),
            "is_greedy": greedy,
            "request": payload,
        }
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return {"ok": False, "why": f"response not in lm_eval's shape ({e!r}): {out}", "request": payload}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="http://HOST:PORT of the HTTP door")
    ap.add_argument("--api-key")
    ap.add_argument("--require-echo", action="store_true")
    ap.add_argument("--json", help="write the findings here")
    a = ap.parse_args()
    base, key, found, failed = a.base.rstrip("/"), a.api_key, {}, []

    def check(name, ok, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        found[name] = {"ok": ok, "detail": detail}
        if not ok:
            failed.append(name)

    if not wait_healthy(base):
        check("health", False, "GET /health never answered 200")
        return 1
    status, models = call(base, "/v1/models", key=key)
    ok = status == 200 and bool(models.get("data"))
    model = models["data"][0]["id"] if ok else None
    max_len = models["data"][0].get("max_model_len") if ok else None
    check("models", ok, f"model {model!r}, max_model_len {max_len}")
    found["model"], found["max_model_len"] = model, max_len

    status, info = call(base, "/tokenizer_info", key=key)
    check("tokenizer_info", status == 200 and isinstance(info, dict) and "eos_token" in info,
          f"{status}: eos_token {info.get('eos_token') if isinstance(info, dict) else info!r}")
    status, tok = call(base, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}, key)
    tokens = tok.get("tokens") if isinstance(tok, dict) else None
    check("tokenize", status == 200 and tokens == [15496, 995] and tok.get("count") == 2,
          f"{status}: 'Hello world' -> {tokens} (GPT-2: [15496, 995])")
    status, detok = call(base, "/detokenize", {"tokens": tokens or []}, key)
    check("detokenize", status == 200 and isinstance(detok, dict) and detok.get("prompt") == "Hello world",
          f"{status}: {detok}")

    with TASK.open(encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    bad = [i for i, d in enumerate(items)
           if not (isinstance(d.get("question"), str) and isinstance(d.get("choices"), list)
                   and isinstance(d.get("answer"), int) and 0 <= d["answer"] < len(d["choices"]))]
    check("task", len(items) == 20 and not bad, f"{len(items)} items in {TASK.name}, malformed: {bad}")

    first = items[0]
    context = f"Question: {first['question']}\nAnswer:"
    ll = loglikelihood(base, key, model, context, " " + first["choices"][first["answer"]])
    found["loglikelihood"] = ll
    if ll["ok"]:
        check("echo+logprobs", True,
              f"ctxlen {ll['ctxlen']}, {ll['entries']} token_logprobs, "
              f"loglikelihood {ll['loglikelihood']:.4f}, greedy {ll['is_greedy']}")
    elif a.require_echo:
        check("echo+logprobs", False, ll["why"])
    else:
        print(f"note echo+logprobs: not served yet: {ll['why']}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(found, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
