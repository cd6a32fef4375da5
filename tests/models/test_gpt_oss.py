"""gpt-oss (rust/model/arch/gpt_oss.rs) against llama.cpp: attention sinks,
alternating sliding-window and global layers, YaRN on both, q/k/v/o
biases, MXFP4 experts routed by their top router logits (with a bias)
softmaxed over the chosen, expert biases and the clamped SwiGLU."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestGptOss(ArchitectureSuite):
    names = ("gpt-oss",)
