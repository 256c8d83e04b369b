"""Real OpenAI-compatible upstreams for the tests: `transformers serve` on 127.0.0.1, serving a tiny random
chat model built at test time (nothing is downloaded, nothing is mocked).

A test module takes the fixtures with `pytest_plugins = ["upstream_server"]`: a plugin defines each fixture
once, so a session-scoped server is shared by every module that asks for it (importing the fixtures into
each module would start one server per module).

What `transformers serve` (5.x) does that tests, and the router, meet:
- it is pinned to the model folder given on its command line: requests name that exact string as "model"
  (`UpstreamServer.model`) or leave "model" out; any other name is answered 400;
- `/health` answers only once the model is loaded (the pinned model loads before the port is bound);
- a request without max_tokens gets max_new_tokens raised to at least 1024, whatever the model's
  generation_config says, so the tiny model's answers must end by themselves (see build_tiny_chat_model);
- fields outside OpenAI's schema are answered 422; some inside it (stream_options, n, ...) are ignored;
- a stream is `data: {chunk}` events: the role first, one event per token, then one with finish_reason and
  usage (always sent); transformers 5.24 sends no `data: [DONE]` and closes the stream instead.

PYTEST_DONT_REWRITE: test modules import this file before pytest loads it as their plugin; the marker spares
them pytest's warning that it came too late to rewrite asserts (this file raises its own errors instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import SUBJECTS, VERBS

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 180.0  # ~5 s alone on 2 cores; far more while a test suite runs beside it
STOP_GRACE_S = 10.0

SPECIAL_TOKENS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
# make_queries' words (so its prompts tokenize with no <unk>), the chat roles, digits and filler words.
CHAT_WORDS = sorted(
    {v.lower() for v in VERBS}
    | set(SUBJECTS)
    | {"system", "user", "assistant", "then", "relate", "it", "to", "the", "of", "and", "a", "is", "answer"}
    | {"agent", "model", "pool", "query", "router", "step", "reason", "number", "light", "stone", "river"}
    | {str(digit) for digit in range(10)}
    | {".", ",", "?", "!"}
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def build_tiny_chat_model(folder: Path, seed: int = 0) -> Path:
    """A tiny random LlamaForCausalLM with a word-level tokenizer and a chat template, saved to `folder`;
    it loads offline with AutoModelForCausalLM / AutoTokenizer. The weights depend on `seed` alone.

    Greedy decoding with no_repeat_ngram_size=1 bans every token already in the sequence, and the EOS token
    (<|endoftext|>) never occurs in a prompt: so an answer ends within len(vocabulary) tokens even when the
    server lifts max_new_tokens to 1024."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *CHAT_WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_input_names=["input_ids", "attention_mask"],  # a causal LM takes no token_type_ids (4.x adds them)
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    # transformers 5 keeps the template in chat_template.jinja; readers of tokenizer_config.json find it there too.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=2))

    # Llama rather than Qwen3: serve parses a Qwen3 answer for <think> blocks, a Llama one streams as it is.
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<pad>"],
    )
    with torch.random.fork_rng(devices=[]):  # the seed picks the weights without touching the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        max_new_tokens=32,
        do_sample=False,
        no_repeat_ngram_size=1,
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<pad>"],
    )
    model.save_pretrained(folder)
    return folder


def serving_skip_reason() -> str | None:
    """Why `transformers serve` cannot run these upstreams here, or None when it can."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__}: `transformers serve` before 5.0 has another interface"
    missing = [name for name in ("fastapi", "uvicorn", "openai", "pydantic") if importlib.util.find_spec(name) is None]
    if missing:
        return f"`transformers serve` needs the serving extra (transformers[serving]); missing: {', '.join(missing)}"
    return None


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the OS picks it; another process may still take it later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def server_env() -> dict[str, str]:
    """The test environment, offline and without proxies: the server reaches nothing but its own folder."""
    env = {key: value for key, value in os.environ.items() if key not in _PROXY_VARIABLES}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",  # the CLI would otherwise ask PyPI for a newer transformers
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",  # a tiny model gains nothing from threads; N servers would fight over 2 cores
        PYTHONUNBUFFERED="1",
    )
    return env


class UpstreamServer:
    """`transformers serve MODEL_DIR` as a subprocess on 127.0.0.1. As a context manager it starts, waits
    until /health answers, and stops at exit; or call start(), wait_ready() and stop() yourself."""

    def __init__(
        self,
        model_dir: Path,
        *,
        port: int | None = None,
        log_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.model = str(Path(model_dir).resolve())  # the name serve is pinned to, and answers to
        self.port = port or free_port()
        self._pick_port = port is None  # only a port picked here may be re-picked when another process took it
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="upstream-")) if log_dir is None else Path(log_dir)
        self.log_path = self.log_dir / f"serve-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None  # seconds from spawn to the first healthy answer
        self._started_at = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, as a client's base_url (`.../v1`)."""
        return f"{self.url}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "transformers.cli.transformers",  # the `transformers` console script, without relying on PATH
            "serve",
            self.model,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--device",
            "cpu",
            *self.extra_args,
        ]

    def start(self) -> UpstreamServer:
        """Spawn the server and return at once (wait_ready() waits for it), so that a pool starts in parallel."""
        if self.running:
            return self
        self.log_path = self.log_dir / f"serve-{self.port}.log"
        # A file, not a pipe: a pipe nobody reads fills up and blocks the server.
        with open(self.log_path, "ab") as log:
            # Its own process group: serve starts helper processes (transformers >= 5.25 spawns a worker
            # and multiprocessing's resource tracker), and stop() must end all of them.
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(),
                start_new_session=True,
            )
        self._started_at = time.monotonic()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> UpstreamServer:
        """Block until GET /health answers 200; on a timeout or an early exit, stop the server and raise
        RuntimeError with the tail of its log."""
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        port_retries = 3
        while True:
            if self.process is None:
                raise RuntimeError("wait_ready() before start()")
            code = self.process.poll()
            if code is not None:
                if self._pick_port and port_retries and "address already in use" in self.log_tail().lower():
                    port_retries -= 1  # the port picked was taken before serve bound it: pick another
                    self.port = free_port()
                    self.start()
                    continue
                raise RuntimeError(f"`transformers serve` exited with code {code} before answering:\n{self.log_tail()}")
            if _health_ok(self.url):
                self.startup_s = time.monotonic() - self._started_at
                return self
            if time.monotonic() > deadline:
                tail = self.log_tail()  # before stop(), which may remove the log
                self.stop()
                raise RuntimeError(
                    f"`transformers serve` on {self.url} did not answer /health within "
                    f"{self.startup_timeout_s if timeout_s is None else timeout_s:.0f} s:\n{tail}"
                )
            time.sleep(0.1)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the server's process group, then SIGKILL after `grace_s`; returns once every process
        of the group is gone (reaped, not only exited). Safe to call twice."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(process.pid, signal.SIGKILL)
                    process.wait()
            _wait_group_gone(process.pid, grace_s)
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of what the server printed (stdout and stderr together)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def chat_body(self, content: str, **fields: object) -> dict:
        """An OpenAI chat-completions request body for this server: one user message, then `fields`."""
        return {"model": self.model, "messages": [{"role": "user", "content": content}], **fields}

    def __enter__(self) -> UpstreamServer:
        try:
            return self.start().wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"UpstreamServer({self.base_url}, model={self.model!r}, running={self.running})"


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _wait_group_gone(pgid: int, grace_s: float) -> None:
    """Wait until no process is left in the group; helpers the leader left behind are killed after
    `grace_s`. Exited helpers stay members until init reaps them, so this also waits out the reaping."""
    killed_at = time.monotonic() + grace_s
    give_up_at = killed_at + grace_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        now = time.monotonic()
        if now > give_up_at:
            raise RuntimeError(f"processes of group {pgid} outlived SIGKILL by {grace_s:.0f} s (unreaped?)")
        if now > killed_at:
            _signal_group(pgid, signal.SIGKILL)
        time.sleep(0.05)


def _health_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_upstreams(model_dirs: Sequence[Path], **kwargs: object) -> list[UpstreamServer]:
    """One server per folder on distinct ports, spawned together and then waited for: a pool starts in
    about the time of one server. If any fails, all are stopped and the error is raised."""
    servers = [UpstreamServer(folder, **kwargs) for folder in model_dirs]  # type: ignore[arg-type]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


@contextlib.contextmanager
def down_upstream() -> Iterator[str]:
    """The base URL of an upstream that is down: a bound socket that does not listen, so a connection is
    refused at once, and no other process can take the port while the block runs."""
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        yield f"http://{HOST}:{holder.getsockname()[1]}/v1"


@contextlib.contextmanager
def stalled_upstream() -> Iterator[str]:
    """The base URL of an upstream that hangs: the kernel accepts connections into the backlog, and nothing
    ever reads a request or answers it (for timeout tests)."""
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(16)
        yield f"http://{HOST}:{listener.getsockname()[1]}/v1"


class ReplayUpstream:
    """A scripted OpenAI-compatible upstream on 127.0.0.1 (a stdlib HTTP server in a thread): each chat
    completion is answered with `reply(body)`, the message text for that request's JSON body, and the
    `usage` given (OpenRouter's billed `cost` included when set), so a test knows every answer, and what
    it cost, in advance. `requests` records every request body. Used as a replay judge whose canned
    verdicts make the rewards known, and as agents whose answers are known."""

    def __init__(self, reply: Callable[[dict], str], usage: dict | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.reply, self.requests = reply, []
        self.usage = {"prompt_tokens": 10, "completion_tokens": 10} if usage is None else usage
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                owner.requests.append(body)
                message = {"role": "assistant", "content": owner.reply(body)}
                answer = {
                    "id": f"replay-{len(owner.requests)}",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": owner.usage,
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.base_url = f"http://{HOST}:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ReplayUpstream:
        # shutdown() waits for the serving loop's next poll: poll often, so a test's teardown is quick
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Scripted:
    """How MisbehavingUpstream answers one request: `status`, `headers` and `body` (JSON when not bytes);
    with `endless`, the body never ends: `body` is sent, then `endless` every `every_s` (a slow model's stream,
    or a huge answer when `every_s` is 0), until the caller closes the connection; with `pieces`, the body is
    those chunks, sent `every_s` apart, and then ends (a stream whose events, or a key in one, are cut across
    chunks that reach the caller one by one)."""

    status: int = 200
    body: object = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    endless: bytes = b""
    every_s: float = 0.2
    pieces: Sequence[bytes] = ()


class MisbehavingUpstream:
    """An upstream on 127.0.0.1 that answers each request as `script(body)` says (Scripted): an error body that
    echoes the key it was sent, a 429 with Retry-After, absurd usage, an answer that never ends. `holding`
    counts the requests it is answering now, `closed` those whose caller closed the connection before the end,
    `requests` records each request body, `heads` each request's line and headers."""

    def __init__(self, script: Callable[[dict], Scripted]) -> None:
        self.script = script
        self.holding = self.closed = 0
        self.requests: list[dict] = []
        self.heads: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def __enter__(self) -> MisbehavingUpstream:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self.answer, HOST, 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def wait_closed(self, before: int, timeout_s: float) -> float | None:
        """Seconds until `closed` exceeds `before` and nothing is held, or None after `timeout_s`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.closed > before and not self.holding:
                return time.monotonic() - started
            time.sleep(0.02)
        return None

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            body = json.loads(await reader.readexactly(length)) if length else {}
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            writer.close()
            return
        self.heads.append(head)
        self.requests.append(body)
        scripted = self.script(body)
        data = scripted.body if isinstance(scripted.body, bytes) else json.dumps(scripted.body).encode()
        headers = {"content-type": "application/json", **scripted.headers}
        chunked = bool(scripted.endless or scripted.pieces)
        framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(data)}"
        # It answers one request per connection, and says so: a client that pooled the connection would
        # race the close and could send its next request into it.
        lines = [
            f"HTTP/1.1 {scripted.status} Scripted",
            *(f"{k}: {v}" for k, v in headers.items()),
            framing,
            "connection: close",
        ]
        self.holding += 1
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            if scripted.pieces:
                for position, piece in enumerate(scripted.pieces):
                    if position:
                        await asyncio.sleep(scripted.every_s)
                    writer.write(_chunk(piece))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return
            if not scripted.endless:
                writer.write(data)
                await writer.drain()
                return
            if data:
                writer.write(_chunk(data))
            while True:
                writer.write(_chunk(scripted.endless))
                await writer.drain()
                try:
                    if not await asyncio.wait_for(reader.read(65536), scripted.every_s):
                        break  # the caller closed the connection
                except TimeoutError:
                    pass
            self.closed += 1
        except ConnectionError:
            self.closed += 1
        finally:
            self.holding -= 1
            writer.close()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def parse_sse(lines: Iterable[str]) -> tuple[list[dict], bool]:
    """(JSON payloads of the `data:` events, whether a `data: [DONE]` ended the stream). Raises
    ValueError on a line that is neither an event nor blank, or on an event after [DONE]."""
    chunks: list[dict] = []
    done = False
    for line in lines:
        if not line.strip():
            continue
        if not line.startswith("data: "):
            raise ValueError(f"not an SSE data line: {line!r}")
        if done:
            raise ValueError(f"an event after [DONE]: {line!r}")
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(payload))
    return chunks, done


@pytest.fixture(scope="session")
def serve_available() -> None:
    """Skips the test when `transformers serve` cannot run here (transformers < 5, or no serving extra)."""
    reason = serving_skip_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a tiny random chat model (seed 0)."""
    return build_tiny_chat_model(tmp_path_factory.mktemp("chat-model"), seed=0)


@pytest.fixture(scope="session")
def upstream(
    serve_available: None, tiny_chat_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UpstreamServer]:
    """One running server for the whole run (a start costs seconds); tests must not stop it."""
    with UpstreamServer(tiny_chat_model, log_dir=tmp_path_factory.mktemp("upstream-log")) as server:
        yield server


@pytest.fixture(scope="module")
def make_upstreams(
    serve_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., list[UpstreamServer]]]:
    """A factory: make_upstreams(count, seeds=None) -> `count` running servers on distinct ports, each with
    its own model (seed i by default, so agents answer differently); all stop at the end of the module."""
    started: list[UpstreamServer] = []

    def make(count: int, seeds: Sequence[int] | None = None) -> list[UpstreamServer]:
        seeds = list(range(count)) if seeds is None else list(seeds)
        if len(seeds) != count:
            raise ValueError(f"{count} servers but {len(seeds)} seeds")
        folders = [build_tiny_chat_model(tmp_path_factory.mktemp(f"chat-model-{seed}"), seed) for seed in seeds]
        servers = start_upstreams(folders, log_dir=tmp_path_factory.mktemp("upstream-logs"))
        started.extend(servers)
        return servers

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def down_upstream_url() -> Iterator[str]:
    """The base URL of an upstream that refuses connections."""
    with down_upstream() as url:
        yield url


@pytest.fixture
def stalled_upstream_url() -> Iterator[str]:
    """The base URL of an upstream that accepts connections and never answers."""
    with stalled_upstream() as url:
        yield url
