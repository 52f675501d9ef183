"""Drive anelm's Files and Batch APIs with the official openai client (called by
tests/batches.rs).

Usage: python batches_client.py BASE_URL API_KEY EMBEDDING_MODEL
Checks: uploads and file listing; a chat batch (one bad line) whose results equal the same
requests made interactively and whose every custom_id appears exactly once across the output and
error files; an embeddings batch equal to /v1/embeddings; cancel; pagination; and every bad input
the API must refuse with the right OpenAI error. Exits non-zero on the first failed check.
"""
import io
import json
import sys
import time

import openai
from openai import OpenAI

base, key, emb_model = sys.argv[1:4]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
chat_model = [m.id for m in client.models.list().data if m.id != emb_model][0]


def jsonl(lines):
    return io.BytesIO(("\n".join(json.dumps(l) for l in lines) + "\n").encode())


def chat_line(i, **extra):
    body = {"model": chat_model, "messages": [{"role": "user", "content": f"Name a colour. ({i})"}],
            "max_tokens": 12, "temperature": 0}
    body.update(extra)
    return {"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def wait(batch_id, limit=300):
    t = time.time()
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        assert time.time() - t < limit, f"batch {batch_id} still {b.status} after {limit} s"
        time.sleep(0.2)


def lines_of(file_id):
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(l) for l in text.splitlines() if l.strip()]


def expect_error(kind, fn, needle):
    try:
        fn()
    except kind as e:
        assert needle in str(e), f"expected '{needle}' in: {e}"
        return e
    raise AssertionError(f"expected {kind.__name__} containing '{needle}'")


# --- Files ---------------------------------------------------------------------------------
lines = [chat_line(i) for i in range(6)]
lines.append(chat_line(6, max_tokens=-1))  # a bad request: fails alone
lines.append(chat_line(7, n=2, logprobs=True, top_logprobs=2))  # everything interactive may use
f = client.files.create(file=("chat.jsonl", jsonl(lines)), purpose="batch")
assert f.purpose == "batch" and f.filename == "chat.jsonl" and f.bytes > 0, f
assert client.files.retrieve(f.id).id == f.id
assert any(x.id == f.id for x in client.files.list().data)
assert client.files.content(f.id).text.count("\n") == len(lines)

# --- A chat batch ----------------------------------------------------------------------------
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                          metadata={"job": "colours"})
assert b.status in ("validating", "in_progress"), b
assert b.request_counts.total == len(lines), b.request_counts
assert b.metadata == {"job": "colours"}, b.metadata
b = wait(b.id)
assert b.status == "completed", b
assert (b.request_counts.completed, b.request_counts.failed) == (7, 1), b.request_counts
out, err = lines_of(b.output_file_id), lines_of(b.error_file_id)
ids = [l["custom_id"] for l in out + err]
assert sorted(ids) == sorted(l["custom_id"] for l in lines), ids
assert [l["custom_id"] for l in err] == ["chat-6"], err
assert err[0]["response"]["status_code"] == 400 and err[0]["error"]["message"], err[0]
for line in out:
    assert line["response"]["status_code"] == 200, line
    assert line["error"] is None
    body = line["response"]["body"]
    i = int(line["custom_id"].split("-")[1])
    if i == 7:
        assert len(body["choices"]) == 2 and body["choices"][0]["logprobs"]["content"], body
        continue
    # The batch line's answer is the interactive answer (greedy: the same text).
    direct = client.chat.completions.create(**lines[i]["body"])
    assert body["choices"][0]["message"]["content"] == direct.choices[0].message.content, (body, direct)

# --- An embeddings batch -------------------------------------------------------------------
texts = ["a note about gardening", "meeting moved to Tuesday", "the quick brown fox"]
emb_lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": emb_model, "input": t}} for i, t in enumerate(texts)]
ef = client.files.create(file=("emb.jsonl", jsonl(emb_lines)), purpose="batch")
eb = wait(client.batches.create(input_file_id=ef.id, endpoint="/v1/embeddings", completion_window="24h").id)
assert eb.status == "completed" and eb.request_counts.completed == 3, eb
direct = client.embeddings.create(model=emb_model, input=texts)
for line in lines_of(eb.output_file_id):
    i = int(line["custom_id"][1:])
    got = line["response"]["body"]["data"][0]["embedding"]
    want = direct.data[i].embedding
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, line["custom_id"]

# --- A Responses batch ---------------------------------------------------------------------
resp_lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
               "body": {"model": chat_model, "input": f"Name a colour. ({i})", "max_output_tokens": 8,
                        "temperature": 0, "store": False}} for i in range(2)]
rf = client.files.create(file=("resp.jsonl", jsonl(resp_lines)), purpose="batch")
rb = wait(client.batches.create(input_file_id=rf.id, endpoint="/v1/responses", completion_window="24h").id)
assert rb.status == "completed" and rb.request_counts.completed == 2, rb
for line in lines_of(rb.output_file_id):
    body = line["response"]["body"]
    assert body["object"] == "response" and body["output"][0]["type"] == "message", body
    i = int(line["custom_id"][1:])
    direct = client.responses.create(**resp_lines[i]["body"])
    assert body["output"][0]["content"][0]["text"] == direct.output_text

# --- Cancel ------------------------------------------------------------------------------------
many = [chat_line(100 + i, max_tokens=64, ignore_eos=True) for i in range(12)]
cf = client.files.create(file=("many.jsonl", jsonl(many)), purpose="batch")
cb = client.batches.create(input_file_id=cf.id, endpoint="/v1/chat/completions", completion_window="24h")
c = client.batches.cancel(cb.id)
assert c.status in ("cancelling", "cancelled"), c
c = wait(cb.id)
assert c.status == "cancelled" and c.cancelled_at, c
done = lines_of(c.output_file_id) + lines_of(c.error_file_id)
assert sorted(l["custom_id"] for l in done) == sorted(l["custom_id"] for l in many), done
never_ran = [l for l in done if l["response"] is None]
assert all(l["error"]["code"] == "batch_cancelled" for l in never_ran), never_ran
expect_error(openai.ConflictError, lambda: client.batches.cancel(cb.id), "can no longer be cancelled")

# --- Listing ---------------------------------------------------------------------------------
page = client.batches.list(limit=1)
assert len(page.data) == 1 and page.has_more, page
assert page.data[0].id == cb.id  # newest first
page2 = client.batches.list(limit=10, after=page.data[0].id)
assert [x.id for x in page2.data][:3] == [rb.id, eb.id, b.id], page2
assert sum(1 for _ in client.batches.list(limit=1)) == 4  # the SDK follows the pages

# --- Bad input -------------------------------------------------------------------------------
expect_error(openai.BadRequestError,
             lambda: client.files.create(file=("x.jsonl", jsonl(lines)), purpose="fine-tune"), "purpose")
expect_error(openai.BadRequestError,
             lambda: client.files.create(file=("x.jsonl", io.BytesIO(b'{"a":1}\nnot json\n')), purpose="batch"),
             "line 2")
dup = client.files.create(file=("dup.jsonl", jsonl([chat_line(1), chat_line(1)])), purpose="batch")
expect_error(openai.BadRequestError,
             lambda: client.batches.create(input_file_id=dup.id, endpoint="/v1/chat/completions",
                                           completion_window="24h"), "line 2")
expect_error(openai.BadRequestError,
             lambda: client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                           completion_window="24h"), "one endpoint per batch")
expect_error(openai.BadRequestError,
             lambda: client.batches.create(input_file_id=f.id, endpoint="/v1/moderations",
                                           completion_window="24h"), "not supported")
expect_error(openai.BadRequestError,
             lambda: client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                           completion_window="2 days"), "completion_window")
expect_error(openai.NotFoundError,
             lambda: client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                           completion_window="24h"), "file-nope")
expect_error(openai.NotFoundError, lambda: client.batches.retrieve("batch_nope"), "batch_nope")
expect_error(openai.NotFoundError, lambda: client.files.retrieve("file-nope"), "file-nope")
expect_error(openai.NotFoundError, lambda: client.files.content("../../etc/passwd"), "not_found")
expect_error(openai.NotFoundError, lambda: client.files.content("file-..%2F..%2Fetc"), "not_found")
big = io.BytesIO(b'{"custom_id":"x","method":"POST","url":"/v1/completions","body":{"prompt":"' + b"a" * 300_000 + b'"}}\n')
e = expect_error(openai.APIStatusError, lambda: client.files.create(file=("big.jsonl", big), purpose="batch"),
                 "--max-file-bytes")
assert e.status_code == 413, e
n_batches = sum(1 for _ in client.batches.list())
assert n_batches == 4, f"a refused batch was stored: {n_batches}"

# --- Delete ----------------------------------------------------------------------------------
d = client.files.delete(dup.id)
assert d.deleted and d.id == dup.id
expect_error(openai.NotFoundError, lambda: client.files.delete(dup.id), dup.id)
print("batches: ok")
