"""The test upstreams themselves: the tiny chat model, and `transformers serve` answering real HTTP requests
as an OpenAI-compatible agent does (non-streaming, streaming, model list), plus the down and stalled ones.

A server takes ~5 s to start on 2 cores, so the tests that need one are marked slow."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers import make_queries
from upstream_server import UpstreamServer, build_tiny_chat_model, parse_sse

httpx = pytest.importorskip("httpx")
pytest_plugins = ["upstream_server"]

PROMPT = make_queries(1, seed=3)[0]


def client(timeout: float = 60) -> httpx.Client:
    return httpx.Client(timeout=timeout, trust_env=False)  # trust_env=False: loopback never goes through a proxy


def chat(server: UpstreamServer, content: str = PROMPT, **fields: object) -> httpx.Response:
    with client() as http:
        return http.post(f"{server.base_url}/chat/completions", json=server.chat_body(content, **fields))


def prompt_length(model_dir: Path, content: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": content}]
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def test_tiny_chat_model_loads_offline_and_its_answers_end_by_themselves(tiny_chat_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_model)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    text = tokenizer.decode(inputs["input_ids"][0])
    assert text.startswith("<|im_start|> user") and text.endswith("<|im_start|> assistant")
    assert tokenizer.unk_token_id not in inputs["input_ids"][0].tolist()  # make_queries' words are all known
    # The server lifts max_new_tokens to 1024; the answer must end on EOS long before.
    output = model.generate(**inputs, max_new_tokens=1024)[0, inputs["input_ids"].shape[1] :]
    assert output[-1].item() == tokenizer.eos_token_id and len(output) <= len(tokenizer)
    assert tokenizer.decode(output, skip_special_tokens=True).strip()

    again = AutoModelForCausalLM.from_pretrained(build_tiny_chat_model(tmp_path / "same", seed=0))
    other = AutoModelForCausalLM.from_pretrained(build_tiny_chat_model(tmp_path / "other", seed=1))
    weights = model.model.embed_tokens.weight
    assert torch.equal(weights, again.model.embed_tokens.weight)
    assert not torch.equal(weights, other.model.embed_tokens.weight)


def test_a_down_upstream_refuses_connections(down_upstream_url):
    started = time.monotonic()
    with client() as http, pytest.raises(httpx.ConnectError):
        http.get(f"{down_upstream_url}/models")
    assert time.monotonic() - started < 5  # refused, not timed out


def test_a_stalled_upstream_accepts_and_never_answers(stalled_upstream_url):
    with client(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.get(f"{stalled_upstream_url}/models")


@pytest.mark.slow
def test_health_and_model_list(upstream):
    with client() as http:
        assert http.get(f"{upstream.url}/health").json() == {"status": "ok"}
        listing = http.get(f"{upstream.base_url}/models").json()
    assert listing["object"] == "list"
    assert [entry["id"] for entry in listing["data"]] == [upstream.model]


@pytest.mark.slow
def test_chat_completion_is_openai_shaped(upstream):
    response = chat(upstream)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == upstream.model
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip()
    assert choice["finish_reason"] == "stop"  # the model ended on EOS by itself
    usage = body["usage"]
    assert usage["prompt_tokens"] == prompt_length(Path(upstream.model), PROMPT)
    assert usage["completion_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert chat(upstream).json()["choices"][0]["message"] == choice["message"]  # greedy: the same answer again


@pytest.mark.slow
def test_max_tokens_cuts_the_answer(upstream):
    body = chat(upstream, max_tokens=3).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


@pytest.mark.slow
def test_model_may_be_left_out_but_not_misnamed(upstream):
    with client() as http:
        anonymous = http.post(
            f"{upstream.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        misnamed = http.post(f"{upstream.base_url}/chat/completions", json=upstream.chat_body("hi", model="other"))
    assert anonymous.status_code == 200 and anonymous.json()["model"] == upstream.model
    assert misnamed.status_code == 400 and "pinned" in misnamed.json()["detail"]


@pytest.mark.slow
def test_streaming_sends_sse_chunks_that_add_up_to_the_answer(upstream):
    body = upstream.chat_body(PROMPT, stream=True, max_tokens=4, stream_options={"include_usage": True})
    with client() as http, http.stream("POST", f"{upstream.base_url}/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks, _done = parse_sse(response.iter_lines())  # transformers 5.24 sends no [DONE]; either is fine
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    # The usage comes last: on the final content chunk (transformers 5.24, which always sends it) or
    # on a chunk of its own with no choices (OpenAI's convention, and transformers from 5.25).
    with_usage = [index for index, chunk in enumerate(chunks) if chunk.get("usage")]
    assert with_usage == [len(chunks) - 1] and chunks[-1]["usage"]["completion_tokens"] == 4
    content_chunks = [chunk for chunk in chunks if chunk["choices"]]
    assert all(len(chunk["choices"]) == 1 for chunk in content_chunks)
    assert content_chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in content_chunks)
    answer = chat(upstream, max_tokens=4).json()["choices"][0]["message"]["content"]
    assert streamed == answer


@pytest.mark.slow
def test_a_pool_of_agents_on_distinct_ports_and_a_stop_leaves_no_process(make_upstreams):
    psutil = pytest.importorskip("psutil")
    started = time.monotonic()
    pool = make_upstreams(3)
    elapsed = time.monotonic() - started
    assert len({server.port for server in pool}) == 3 and len({server.model for server in pool}) == 3
    assert all(server.running and server.startup_s is not None for server in pool)
    answers = [chat(server).json()["choices"][0]["message"]["content"] for server in pool]
    assert len(set(answers)) > 1, answers  # different seeds, different agents
    print(f"pool of 3 ready in {elapsed:.1f} s; alone: {[round(s.startup_s or 0, 1) for s in pool]}")

    # One agent goes down, with every process it started; the others still answer.
    process = psutil.Process(pool[0].process.pid)
    family = [process, *process.children(recursive=True)]
    pool[0].stop()
    assert not pool[0].running and not any(member.is_running() for member in family)
    pool[0].stop()  # a second stop is harmless
    with client() as http, pytest.raises(httpx.ConnectError):
        http.get(f"{pool[0].base_url}/models")
    assert chat(pool[1]).status_code == 200


@pytest.mark.slow
def test_a_server_that_cannot_start_says_why(serve_available, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder with no model in it
    server = UpstreamServer(tmp_path, log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="exited with code") as error, server:
        pass
    assert 'File "' in str(error.value)  # the tail of the server's traceback came with the error
    assert not server.running
