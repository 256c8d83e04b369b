"""benchgen-router convert: a trainer release (manifest.json + head_weights.npy) -> a router folder.

    benchgen-router convert --manifest manifest.json --weights head_weights.npy --output-dir router/

The folder holds config.json, model.safetensors (the head only, or backbone + head with
--bundle-backbone), the two remote-code files, the backbone's tokenizer and a model card, and
loads with AutoModel.from_pretrained(folder, trust_remote_code=True) or the text-classification
pipeline. Every input is validated before anything is written; on error nothing is left behind.
A non-empty folder that holds no router is refused unless --overwrite (which deletes nothing the
converter does not write); a router folder, such as the repository root (`--output-dir .`), is
replaced: its config, weights, code, tokenizer and card, keeping any README text after the card.
A release with an out-of-distribution guard (ood_guard.safetensors next to the weights, or
--ood-stats PATH) gets it in model.safetensors and config.json; --no-ood-guard leaves it out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, read_card_note

HELP = "convert a trainer release into a router folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--manifest", required=True, type=Path, help="manifest.json written by the trainer")
    parser.add_argument("--weights", required=True, type=Path, help="head_weights.npy: flat float vector theta")
    parser.add_argument("--output-dir", required=True, type=Path, help="folder to write the router into")
    parser.add_argument(
        "--backbone",
        help="read the backbone's config and tokenizer from here: a Hub id or a local copy "
        "(default: the manifest's backbone_model)",
    )
    parser.add_argument(
        "--backbone-id",
        help="the backbone id the folder records (default: the manifest's backbone_model, else --backbone)",
    )
    parser.add_argument("--backbone-revision", help="pin the backbone to this revision (branch, tag or commit)")
    parser.add_argument(
        "--bundle-backbone", action="store_true", help="store the backbone's weights in model.safetensors too"
    )
    parser.add_argument(
        "--ood-stats",
        type=Path,
        metavar="PATH",
        help="the out-of-distribution guard's statistics (.safetensors or .npz; default: "
        "ood_guard.safetensors next to --weights, when present)",
    )
    parser.add_argument(
        "--ood-fallback-agent",
        metavar="AGENT",
        help="the agent that answers flagged queries (default: the one the manifest or the statistics name)",
    )
    parser.add_argument("--no-ood-guard", action="store_true", help="leave the release's out-of-distribution guard out")
    parser.add_argument("--card-note", metavar="TEXT|@FILE", help="markdown appended to the model card")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty folder that holds no router")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="upload the folder's model files to this Hub repo")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.release.convert import convert_release
    from benchgen_router.release.folder import push_folder

    card_note = read_card_note(args.card_note)
    folder = convert_release(
        args.manifest,
        args.weights,
        args.output_dir,
        backbone=args.backbone,
        backbone_revision=args.backbone_revision,
        backbone_id=args.backbone_id,
        bundle=args.bundle_backbone,
        overwrite=args.overwrite,
        ood_stats=args.ood_stats,
        ood_guard=not args.no_ood_guard,
        ood_fallback_agent=args.ood_fallback_agent,
        card_note=card_note,
    )
    if args.push_to_hub:
        push_folder(folder, args.push_to_hub)
    return 0
