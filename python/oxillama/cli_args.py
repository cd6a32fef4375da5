"""Command-line arguments more than one command takes."""

from __future__ import annotations

import argparse

__all__ = ["HF_HELP", "add_hf_arg"]

HF_HELP = (
    "a GGUF from the Hugging Face Hub instead of --model: REPO or REPO:FILE, FILE a name or "
    "a glob matching exactly one file (default *.gguf); uses huggingface_hub's cache "
    "(HF_HUB_OFFLINE=1: the cache only). Needs: pip install 'oxillama[hub]'"
)


def add_hf_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", metavar="REPO[:FILE]", help=HF_HELP)
