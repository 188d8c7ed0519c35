"""serve_lm through the real `openai` Python client: completions (whole, streamed, n > 1, stop, logprobs), chat
(whole and streamed), the models list, and the client's own exceptions for bad requests. Exits non-zero on the first
mismatch. Run by tests/openai_client.sh (ctest) with a Python that has `openai` installed:

    python3 -m venv /tmp/openai-venv && /tmp/openai-venv/bin/pip install openai
    cmake -DLEVANTER_OPENAI_PYTHON=/tmp/openai-venv/bin/python build

Usage: openai_client_check.py BASE_URL MODEL
"""
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


models = client.models.list()
check([m.id for m in models.data] == [model], f"models.list: {models}")

greedy = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
check(greedy.object == "text_completion" and len(greedy.choices) == 1, f"completion: {greedy}")
check(greedy.usage.completion_tokens >= 1 and greedy.usage.total_tokens == greedy.usage.prompt_tokens + greedy.usage.completion_tokens,
      f"usage: {greedy.usage}")
again = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
check(again.choices[0].text == greedy.choices[0].text, "greedy gave two texts")

many = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, n=3, seed=4, logprobs=0)
check([c.index for c in many.choices] == [0, 1, 2], f"n=3: {many}")
for c in many.choices:
    check(len(c.logprobs.token_logprobs) == len(c.logprobs.tokens) >= 1, f"logprobs: {c.logprobs}")
# Choice 0 of a seeded request is the request with n=1 and the same seed.
one = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, n=1, seed=4)
check(one.choices[0].text == many.choices[0].text, "choice 0 of n=3 differs from n=1 with the same seed")

stream = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, seed=4, stream=True,
                                   stream_options={"include_usage": True})
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
check(text == one.choices[0].text, f"stream spelled {text!r}, whole {one.choices[0].text!r}")
check(finish == one.choices[0].finish_reason and usage is not None, f"stream end: {finish} {usage}")

if len(one.choices[0].text) >= 3:
    stop = one.choices[0].text[1:3]
    cut = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, seed=4, stop=[stop])
    check(stop not in cut.choices[0].text and cut.choices[0].finish_reason == "stop", f"stop {stop!r}: {cut}")

chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                      temperature=0.5, seed=9, logprobs=True)
check(chat.object == "chat.completion" and chat.choices[0].message.role == "assistant", f"chat: {chat}")
check(len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens, f"chat logprobs: {chat}")
parts = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                       temperature=0.5, seed=9, stream=True)
content = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
check(content == chat.choices[0].message.content, f"chat stream {content!r} vs {chat.choices[0].message.content!r}")

for kwargs, exc in [({"model": "no-such-model"}, openai.NotFoundError), ({"max_tokens": 100000}, openai.BadRequestError),
                    ({"n": 1000}, openai.BadRequestError), ({"top_p": 0}, openai.BadRequestError)]:
    args = {"model": model, "prompt": "x", "max_tokens": 4, **kwargs}
    try:
        client.completions.create(**args)
        check(False, f"{kwargs} was accepted")
    except exc as e:
        check(e.status_code in (400, 404) and e.body and e.body.get("message"), f"{kwargs}: {e}")
check(client.completions.create(model=model, prompt="x", max_tokens=2).choices, "the server stopped serving")
print("openai client: ok")
