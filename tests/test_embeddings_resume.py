"""embeddings.py: an embedding run keeps its finished chunks, so one stopped by Ctrl-C (SIGINT to its
process group, in a real subprocess) resumes from them and ends with exactly the embeddings of a run
that was never stopped."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from benchgen_router.embeddings import embed_prompts
from helpers import AGENTS, make_queries

PROMPTS = 160
CHUNK = 4

# The run to interrupt: each chunk is slowed a little so that a SIGINT lands mid-run on any machine.
INTERRUPTED_RUN = textwrap.dedent(
    """
    import sys, time
    import benchgen_router.routing as routing
    from benchgen_router.embeddings import embed_prompts
    from helpers import AGENTS, make_queries

    real = routing.run_router

    def slow(*args, **kwargs):
        result = real(*args, **kwargs)
        time.sleep(0.2)
        return result

    routing.run_router = slow
    prompts = make_queries(int(sys.argv[3]))
    embed_prompts(prompts, sys.argv[1], AGENTS, cache_dir=sys.argv[2], chunk_prompts=int(sys.argv[4]))
    """
)


def chunk_files(cache_dir):
    return sorted(cache_dir.glob("*.partial/*.npy"))


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a process group is POSIX")
def test_an_interrupted_embedding_resumes_and_matches_an_uninterrupted_one(tmp_path, backbone_dir, caplog):
    cache = tmp_path / "cache"
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", INTERRUPTED_RUN, str(backbone_dir), str(cache), str(PROMPTS), str(CHUNK)]
    process = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(chunk_files(cache)) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, f"the run ended before it could be interrupted: {process.stderr.read()[-2000:]}"
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr

    kept = chunk_files(cache)
    assert 3 <= len(kept) < PROMPTS // CHUNK
    assert not list(cache.glob("*.npy"))  # no finished cache file from a stopped run
    assert sorted(p for p in cache.rglob("*") if p.is_file()) == kept  # no temp files
    for path in kept:
        assert np.load(path, allow_pickle=False).shape == (CHUNK, 32)

    prompts = make_queries(PROMPTS)
    with caplog.at_level(logging.INFO, logger="benchgen_router"):
        resumed = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=cache, chunk_prompts=CHUNK)
    assert f"resuming: {len(kept) * CHUNK} of {PROMPTS} prompts already embedded" in caplog.text
    assert not resumed.from_cache and resumed.cache_file.is_file()
    assert not list(cache.glob("*.partial"))  # the chunks are gone once the cache file is written

    never_stopped = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path / "other", chunk_prompts=CHUNK)
    assert np.array_equal(resumed.vectors, never_stopped.vectors)
    uncached = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=None, chunk_prompts=CHUNK)
    assert np.array_equal(resumed.vectors, uncached.vectors)
    again = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=cache, chunk_prompts=CHUNK)
    assert again.from_cache and np.array_equal(again.vectors, resumed.vectors)


def test_an_empty_query_is_named_by_its_position_in_the_whole_list(tmp_path, backbone_dir):
    from benchgen_router.routing import EmptyQueryError

    prompts = make_queries(10)
    prompts[6] = ""  # no tokens at all with this byte-level tokenizer
    with pytest.raises(EmptyQueryError) as caught:
        embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path, chunk_prompts=4)
    assert caught.value.positions == [6]


def test_a_bad_chunk_size_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="chunk_prompts must be a positive integer"):
        embed_prompts(["a"], str(tmp_path / "no-backbone"), AGENTS, chunk_prompts=0)
