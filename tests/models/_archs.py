"""What each fixture holds: its metadata and tensors, in the conventions of
llama.cpp's converter and loader for that ``general.architecture``, with the
architecture's special features switched on.

Weight matrices are N(0, gain^2 / ne0), so a unit-RMS input gives outputs of
RMS ``gain``. Logits have a standard deviation of about 3, so the softmax is
far from uniform over the ~300 tokens. The residual branches (attention
output, FFN down, SSM out) are amplified so the layers, not the token's own
embedding, dominate the final hidden state: with tied embeddings a dominant
embedding would make every position predict its own input token."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import gguf
import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as FT

from tests.models._vocab import VOCAB

N_EMBD = 256
N_VOCAB = len(VOCAB.tokens)
QK_GAIN = 1.5  # q and k: attention scores with a standard deviation of ~2
OUT_GAIN = 3.0  # logits with a standard deviation of ~3
RES_GAIN = 3.0  # attention output, FFN down and SSM out
POST_NORM = 3.0  # post-attention / post-FFN norm weights: the branch scale
# A tied embedding is small, like real ones; the output norm's weights
# (OUT_GAIN / (16 * TIED_EMBD_STD)) then give the logits their spread.
TIED_EMBD_STD = 1 / 32
TIED_OUT_NORM = OUT_GAIN / (math.sqrt(N_EMBD) * TIED_EMBD_STD)


def tn(kind: T, bid: int | None = None, suffix: str = "weight") -> str:
    base = gguf.TENSOR_NAMES[kind].format(bid=bid)
    return f"{base}.{suffix}" if suffix else base


@dataclass
class Tensor:
    name: str
    data: np.ndarray  # float32, numpy order: (..., ne1, ne0)
    matrix: bool  # takes a format from the cycle; otherwise stays F32


@dataclass
class Builder:
    rng: np.random.Generator
    tensors: list[Tensor] = field(default_factory=list)

    def mat(self, name: str, ne0: int, ne1: int, gain: float = 1.0, cycled: bool = True) -> None:
        """``cycled`` False keeps the matrix F32, out of the format cycle."""
        w = self.rng.standard_normal((ne1, ne0)) * (gain / math.sqrt(ne0))
        self.tensors.append(Tensor(name, w.astype(np.float32), cycled))

    def mat3(self, name: str, ne0: int, ne1: int, ne2: int, gain: float = 1.0) -> None:
        """A stack of ``ne2`` matrices (the experts of a MoE layer)."""
        w = self.rng.standard_normal((ne2, ne1, ne0)) * (gain / math.sqrt(ne0))
        self.tensors.append(Tensor(name, w.astype(np.float32), True))

    def norm(self, name: str, shape: tuple[int, ...], around: float = 1.0) -> None:
        """Norm weights: ``around`` plus noise, so a missed or misplaced norm
        shows."""
        w = around + 0.1 * self.rng.standard_normal(shape)
        self.tensors.append(Tensor(name, w.astype(np.float32), False))

    def bias(self, name: str, n: int, std: float = 0.1) -> None:
        self.tensors.append(
            Tensor(name, (std * self.rng.standard_normal(n)).astype(np.float32), False)
        )

    def const(self, name: str, data: np.ndarray) -> None:
        self.tensors.append(Tensor(name, data.astype(np.float32), False))


@dataclass(frozen=True)
class Fixture:
    name: str
    arch: str
    build: Callable[[gguf.GGUFWriter, Builder], None]
    features: str
    # One reference per context size; the first is the main one.
    n_ctx: tuple[int, ...] = (256,)
    # A fixture of one weight type holds every matrix in it (with
    # ``experts_only``, only the MoE experts, the other matrices Q8_0) and
    # names it in general.file_type; otherwise the 13-format cycle.
    weight_type: Q | None = None
    experts_only: bool = False
    file_type: FT | None = None
    # With the 13-format cycle: the MoE experts all in this type instead
    # (gpt-oss ships MXFP4 experts), the other matrices cycling.
    experts_type: Q | None = None

    def type_of(self, tensor: str) -> Q:
        assert self.weight_type is not None
        if self.experts_only and "_exps." not in tensor:
            return Q.Q8_0
        return self.weight_type


def hparams(
    w: gguf.GGUFWriter,
    n_layer: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    *,
    rms_eps: float | None = 1e-5,
    ln_eps: float | None = None,
    ctx: int = 2048,
    rope_base: float | None = 10000.0,
    head_dim: int | None = None,
) -> None:
    """The keys nearly every converter writes."""
    w.add_context_length(ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if rms_eps is not None:
        w.add_layer_norm_rms_eps(rms_eps)
    if ln_eps is not None:
        w.add_layer_norm_eps(ln_eps)
    if rope_base is not None:
        w.add_rope_freq_base(rope_base)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)


def embeddings(b: Builder, *, tied: bool, std: float = TIED_EMBD_STD) -> None:
    """token_embd: unit RMS rows, or ``std`` when it is also the output
    matrix (tied)."""
    b.mat(tn(T.TOKEN_EMBD), N_EMBD, N_VOCAB, (std if tied else 1.0) * math.sqrt(N_EMBD))


def head(b: Builder, *, tied: bool, bias: bool = False, norm: float = TIED_OUT_NORM) -> None:
    b.norm(tn(T.OUTPUT_NORM), (N_EMBD,), around=norm if tied else 1.0)
    if bias:
        b.bias(tn(T.OUTPUT_NORM, suffix="bias"), N_EMBD)
    if not tied:
        b.mat(tn(T.OUTPUT), N_EMBD, N_VOCAB, OUT_GAIN)


def attention(
    b: Builder,
    i: int,
    n_head: int,
    n_kv: int,
    hd: int,
    *,
    qkv_bias: float = 0.0,
    out_bias: bool = False,
    fused: bool = False,
) -> None:
    q, kv = n_head * hd, n_kv * hd
    if fused:
        b.mat(tn(T.ATTN_QKV, i), N_EMBD, q + 2 * kv, QK_GAIN)
    else:
        b.mat(tn(T.ATTN_Q, i), N_EMBD, q, QK_GAIN)
        b.mat(tn(T.ATTN_K, i), N_EMBD, kv, QK_GAIN)
        b.mat(tn(T.ATTN_V, i), N_EMBD, kv)
    if qkv_bias:
        b.bias(tn(T.ATTN_Q, i, "bias"), q, qkv_bias)
        b.bias(tn(T.ATTN_K, i, "bias"), kv, qkv_bias)
        # A v bias reaches every position unchanged: a large one would
        # push every prediction towards the same few tokens.
        b.bias(tn(T.ATTN_V, i, "bias"), kv, qkv_bias / 5)
    b.mat(tn(T.ATTN_OUT, i), q, N_EMBD, RES_GAIN)
    if out_bias:
        b.bias(tn(T.ATTN_OUT, i, "bias"), N_EMBD)


def gated_ffn(b: Builder, i: int, n_ff: int) -> None:
    b.mat(tn(T.FFN_GATE, i), N_EMBD, n_ff)
    b.mat(tn(T.FFN_UP, i), N_EMBD, n_ff)
    b.mat(tn(T.FFN_DOWN, i), n_ff, N_EMBD, RES_GAIN)


def qk_norms(b: Builder, i: int, hd: int) -> None:
    # Per-head norms reset q and k to unit RMS; weights above 1 keep the
    # attention peaked.
    b.norm(tn(T.ATTN_Q_NORM, i), (hd,), around=1.5)
    b.norm(tn(T.ATTN_K_NORM, i), (hd,), around=1.5)


def dense_layers(
    b: Builder, n_layer: int, n_head: int, n_kv: int, hd: int, n_ff: int, *, qk_norm: bool = False
) -> None:
    """Pre-norm layers of attention (with per-head q/k norms if ``qk_norm``)
    and a gated FFN, as llama and its many descendants have them."""
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, hd)
        if qk_norm:
            qk_norms(b, i, hd)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        gated_ffn(b, i, n_ff)


def llama3_rope_factors(
    base: float, dim: int, factor: float, low: float, high: float, old_ctx: int
) -> np.ndarray:
    """Llama-3 ``rope_freqs``: each frequency's divisor, 1 for short
    wavelengths, ``factor`` for long ones, interpolated between."""
    out = []
    for j in range(dim // 2):
        wavelen = 2 * math.pi * base ** (2 * j / dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


# --- the architectures -------------------------------------------------------


def llama(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, base = 2, 8, 2, 128, 500000.0
    hd = N_EMBD // n_head
    hparams(w, n_layer, n_head, n_kv, n_ff, rope_base=base)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(hd)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    embeddings(b, tied=False)
    # Llama 3 frequency factors with an original context short enough that
    # they bite within the test sequence.
    b.const(tn(T.ROPE_FREQS), llama3_rope_factors(base, hd, 8.0, 1.0, 4.0, 64))
    dense_layers(b, n_layer, n_head, n_kv, hd, n_ff)
    head(b, tied=False)


def mistral3(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, hd = 2, 4, 2, 128, 32
    hparams(w, n_layer, n_head, n_kv, n_ff, rope_base=1e6, head_dim=hd)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(hd)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(16)
    w.add_rope_scaling_yarn_beta_fast(16.0)
    w.add_rope_scaling_yarn_beta_slow(2.0)
    w.add_rope_scaling_yarn_log_mul(0.707)
    w.add_attn_temperature_scale(0.1)
    embeddings(b, tied=False)
    dense_layers(b, n_layer, n_head, n_kv, hd, n_ff)
    head(b, tied=False)


def qwen2(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff = 2, 8, 2, 128
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, rope_base=1e6)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(32)
    embeddings(b, tied=True)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, N_EMBD // n_head, qkv_bias=0.5)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        gated_ffn(b, i, n_ff)
    head(b, tied=True)


def qwen3(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, hd = 2, 4, 2, 128, 32
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, rope_base=1e6, head_dim=hd)
    embeddings(b, tied=True)
    dense_layers(b, n_layer, n_head, n_kv, hd, n_ff, qk_norm=True)
    head(b, tied=True)


def gemma_norm(b: Builder, name: str, around: float = 1.0) -> None:
    """Gemma's RMSNorm multiplies by (1 + w); the converter stores 1 + w, so
    the file holds the plain multiplier."""
    b.norm(name, (N_EMBD,), around=around)


def gemma(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, hd = 2, 4, 1, 128, 32
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, head_dim=hd)
    # The input is scaled by sqrt(n_embd) = 16: a tied embedding half the
    # usual size enters the residual at RMS 0.25.
    embeddings(b, tied=True, std=TIED_EMBD_STD / 2)
    for i in range(n_layer):
        gemma_norm(b, tn(T.ATTN_NORM, i))
        attention(b, i, n_head, n_kv, hd)
        gemma_norm(b, tn(T.FFN_NORM, i))
        gated_ffn(b, i, n_ff)
    gemma_norm(b, tn(T.OUTPUT_NORM), 2 * TIED_OUT_NORM)


def gemma2(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, hd = 2, 4, 2, 128, 32
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, head_dim=hd)
    w.add_attn_logit_softcapping(4.0)
    w.add_final_logit_softcapping(15.0)
    w.add_sliding_window(8)
    embeddings(b, tied=True)
    for i in range(n_layer):
        gemma_norm(b, tn(T.ATTN_NORM, i))
        attention(b, i, n_head, n_kv, hd)
        gemma_norm(b, tn(T.ATTN_POST_NORM, i), POST_NORM)
        gemma_norm(b, tn(T.FFN_NORM, i))
        gated_ffn(b, i, n_ff)
        gemma_norm(b, tn(T.FFN_POST_NORM, i), POST_NORM)
    # Raw logits twice as wide as elsewhere: the final softcap squeezes the
    # top ones and the softmax stays peaked.
    gemma_norm(b, tn(T.OUTPUT_NORM), 2 * TIED_OUT_NORM)


def gemma3(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, hd = 3, 4, 1, 128, 32
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, rope_base=1e6, head_dim=hd)
    w.add_rope_freq_base_swa(10000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(8.0)
    w.add_sliding_window(8)
    # Every third layer global, so three layers hold both kinds (the
    # converter leaves the pattern to llama.cpp's default of 6).
    w.add_sliding_window_pattern(3)
    embeddings(b, tied=True)
    for i in range(n_layer):
        gemma_norm(b, tn(T.ATTN_NORM, i))
        attention(b, i, n_head, n_kv, hd)
        qk_norms(b, i, hd)
        gemma_norm(b, tn(T.ATTN_POST_NORM, i), POST_NORM)
        gemma_norm(b, tn(T.FFN_NORM, i))
        gated_ffn(b, i, n_ff)
        gemma_norm(b, tn(T.FFN_POST_NORM, i), POST_NORM)
    gemma_norm(b, tn(T.OUTPUT_NORM), TIED_OUT_NORM)


# Gemma-3n. llama.cpp 0.3.36 fixes what the converter's keys describe: the
# first 20 layers keep keys and values (the rest reuse layer 18's, sliding,
# or 19's, global), the first 10 layers sparsify their FFN gate, 4 AltUp
# streams with stream 0 active, per-layer inputs of 256. The fixture
# therefore has 22 layers (layer 20 sliding, 21 global: both kinds of
# shared layer) at a width of 64, and writes every key as the converter
# does, with the values llama.cpp assumes.
GEMMA3N_LAYERS = 22
GEMMA3N_EMBD = 64
GEMMA3N_PER_LAYER = 256
GEMMA3N_ALTUP = 4
GEMMA3N_LAUREL = 64
GEMMA3N_SPARSE_LAYERS = 10
GEMMA3N_STD_MUL = 1.6448533535003662  # the normal distribution's icdf(0.95)


def gemma3n(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, e, pl, alt = GEMMA3N_LAYERS, GEMMA3N_EMBD, GEMMA3N_PER_LAYER, GEMMA3N_ALTUP
    n_head, n_kv, hd, n_ff = 2, 1, 32, 256
    w.add_context_length(2048)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    # Per layer, as the converter writes Gemma-3n's list of widths.
    w.add_feed_forward_length([n_ff] * n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_final_logit_softcapping(30.0)
    w.add_sliding_window(8)
    # Every fifth layer global (as E2B), and layer 21 too: the shared layers
    # 20 and 21 then reuse both a sliding and a global cache.
    w.add_sliding_window_pattern([not (il % 5 == 4 or il == 21) for il in range(n_layer)])
    w.add_altup_active_idx(0)
    w.add_altup_num_inputs(alt)
    w.add_embedding_length_per_layer_input(pl)
    w.add_shared_kv_layers(n_layer - 20)
    sparsity = [GEMMA3N_STD_MUL] * GEMMA3N_SPARSE_LAYERS
    w.add_activation_sparsity_scale(sparsity + [-math.inf] * (n_layer - len(sparsity)))
    std = TIED_EMBD_STD
    b.mat(tn(T.TOKEN_EMBD), e, N_VOCAB, std * math.sqrt(e))
    b.mat3(tn(T.ALTUP_PROJ), e, e, alt - 1)
    b.mat3(tn(T.ALTUP_UNEMBD_PROJ), e, e, alt - 1)
    b.mat(tn(T.PER_LAYER_TOKEN_EMBD), pl * n_layer, N_VOCAB, math.sqrt(pl * n_layer) / 16)
    b.mat(tn(T.PER_LAYER_MODEL_PROJ), e, pl * n_layer, math.sqrt(e))
    b.norm(tn(T.PER_LAYER_PROJ_NORM), (pl,))
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (e,))
        b.mat(tn(T.ATTN_Q, i), e, n_head * hd, QK_GAIN)
        b.mat(tn(T.ATTN_K, i), e, n_kv * hd, QK_GAIN)
        b.mat(tn(T.ATTN_V, i), e, n_kv * hd)
        b.mat(tn(T.ATTN_OUT, i), n_head * hd, e, RES_GAIN)
        b.norm(tn(T.ATTN_Q_NORM, i), (hd,), around=0.6)
        b.norm(tn(T.ATTN_K_NORM, i), (hd,), around=0.6)
        b.norm(tn(T.ATTN_POST_NORM, i), (e,), around=0.3)
        b.norm(tn(T.FFN_NORM, i), (e,))
        b.mat(tn(T.FFN_GATE, i), e, n_ff)
        b.mat(tn(T.FFN_UP, i), e, n_ff)
        b.mat(tn(T.FFN_DOWN, i), n_ff, e, RES_GAIN)
        b.norm(tn(T.FFN_POST_NORM, i), (e,), around=0.3)
        b.mat(tn(T.PER_LAYER_INP_GATE, i), e, pl)
        b.mat(tn(T.PER_LAYER_PROJ, i), pl, e)
        b.norm(tn(T.PER_LAYER_POST_NORM, i), (e,))
        # The AltUp coefficients are 4 wide: they stay F32, as converted.
        b.const(tn(T.ALTUP_CORRECT_COEF, i), 0.02 * b.rng.standard_normal((alt, alt)))
        b.norm(tn(T.ALTUP_CORRECT_SCALE, i), (e,))
        b.const(tn(T.ALTUP_PREDICT_COEF, i), 0.02 * b.rng.standard_normal((alt * alt, alt)))
        b.mat(tn(T.ALTUP_ROUTER, i), e, alt, float(e))
        b.norm(tn(T.ALTUP_ROUTER_NORM, i), (e,))
        b.mat(tn(T.LAUREL_L, i), e, GEMMA3N_LAUREL)
        b.mat(tn(T.LAUREL_R, i), GEMMA3N_LAUREL, e)
        b.norm(tn(T.LAUREL_POST_NORM, i), (e,))
    b.norm(tn(T.OUTPUT_NORM), (e,), around=OUT_GAIN / (math.sqrt(e) * std))


PHI3_ORIG_CTX = 256
PHI3_CTX = 1024


def phi3(w: gguf.GGUFWriter, b: Builder) -> None:
    # Three layers: fused matrices leave 4 a layer, and 14 hold all 13 formats.
    n_layer, n_head, n_kv, n_ff = 3, 8, 2, 128
    hd = N_EMBD // n_head
    n_rot = int(0.75 * N_EMBD) // n_head  # partial_rotary_factor 0.75, as Phi-4-mini
    hparams(w, n_layer, n_head, n_kv, n_ff, ctx=PHI3_CTX)
    w.add_rope_scaling_orig_ctx_len(PHI3_ORIG_CTX)
    w.add_rope_dimension_count(n_rot)
    scale = PHI3_CTX / PHI3_ORIG_CTX
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(PHI3_ORIG_CTX)))
    # llama.cpp reads this and then turns sliding windows off for phi3.
    w.add_sliding_window(16)
    embeddings(b, tied=False)
    j = np.arange(n_rot // 2) / (n_rot // 2 - 1)
    b.const(tn(T.ROPE_FACTORS_LONG), np.exp(j * math.log(40.0)))
    b.const(tn(T.ROPE_FACTORS_SHORT), 1.0 + 0.5 * j**2)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, hd, fused=True)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        b.mat(tn(T.FFN_UP, i), N_EMBD, 2 * n_ff)  # gate rows, then up rows
        b.mat(tn(T.FFN_DOWN, i), n_ff, N_EMBD, RES_GAIN)
    head(b, tied=False)


def command_r(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff, logit_scale = 2, 8, 2, 128, 0.25
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=None, ln_eps=1e-5)
    w.add_logit_scale(logit_scale)
    embeddings(b, tied=True)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, N_EMBD // n_head)
        gated_ffn(b, i, n_ff)
    # Larger output-norm weights make up for the logit scale.
    head(b, tied=True, norm=TIED_OUT_NORM / logit_scale)


def starcoder2(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff = 2, 8, 2, 256
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=None, ln_eps=1e-5, rope_base=999999.4)
    embeddings(b, tied=False)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        b.bias(tn(T.ATTN_NORM, i, "bias"), N_EMBD)
        attention(b, i, n_head, n_kv, N_EMBD // n_head, qkv_bias=0.3, out_bias=True)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        b.bias(tn(T.FFN_NORM, i, "bias"), N_EMBD)
        b.mat(tn(T.FFN_UP, i), N_EMBD, n_ff)
        b.bias(tn(T.FFN_UP, i, "bias"), n_ff)
        b.mat(tn(T.FFN_DOWN, i), n_ff, N_EMBD, RES_GAIN)
        b.bias(tn(T.FFN_DOWN, i, "bias"), N_EMBD)
    head(b, tied=False, bias=True)


def granite(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff = 2, 8, 2, 128
    logit_scale = 2.0
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(N_EMBD // n_head)
    w.add_embedding_scale(4.0)
    w.add_residual_scale(0.5)
    w.add_attention_scale(0.25)  # default would be 1/sqrt(32) ~ 0.177
    w.add_logit_scale(logit_scale)  # logits are divided by it
    embeddings(b, tied=True)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, N_EMBD // n_head)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        gated_ffn(b, i, n_ff)
    head(b, tied=True, norm=TIED_OUT_NORM * logit_scale)


# Mamba-2: d_inner = expand * n_embd with expand 0.5 (small files), four
# heads of 32 in two groups.
SSM_D_INNER, SSM_D_STATE, SSM_N_GROUP, SSM_HEAD_DIM, SSM_D_CONV = 128, 16, 2, 32, 4


def mamba2(w: gguf.GGUFWriter, b: Builder) -> None:
    # Six layers: with 2 matrices a layer (and only ssm_in wide enough for the
    # K-quants), that is what it takes to hold all 13 formats.
    n_layer = 6
    n_head = SSM_D_INNER // SSM_HEAD_DIM
    w.add_context_length(1 << 20)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(SSM_D_CONV)
    w.add_ssm_inner_size(SSM_D_INNER)
    w.add_ssm_state_size(SSM_D_STATE)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(SSM_N_GROUP)
    w.add_layer_norm_rms_eps(1e-5)
    embeddings(b, tied=False)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        mamba2_mixer(b, i, SSM_D_INNER, SSM_D_STATE, SSM_N_GROUP, SSM_HEAD_DIM, SSM_D_CONV)
    head(b, tied=False)


LFM2_L_CACHE = 3
# Convolution, attention, convolution: llama.cpp picks each layer's kind
# from the per-layer KV head count (0: convolution).
LFM2_KV_HEADS = (0, 2, 0)


def lfm2_hparams(w: gguf.GGUFWriter, n_head: int, n_ff: int) -> None:
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(LFM2_KV_HEADS))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(list(LFM2_KV_HEADS))
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(LFM2_L_CACHE)
    w.add_vocab_size(N_VOCAB)


def lfm2_mixer(b: Builder, i: int, n_kv: int, n_head: int, hd: int) -> None:
    """Layer ``i``'s norm, its short convolution (``n_kv`` 0) or attention,
    and the FFN's norm."""
    b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
    if n_kv == 0:
        # B, C and x: B x through the convolution, then gated by C.
        b.mat(tn(T.SHORTCONV_INPROJ, i), N_EMBD, 3 * N_EMBD, 1.5)
        b.const(tn(T.SHORTCONV_CONV, i), 0.6 * b.rng.standard_normal((N_EMBD, LFM2_L_CACHE)))
        b.mat(tn(T.SHORTCONV_OUTPROJ, i), N_EMBD, N_EMBD, RES_GAIN)
    else:
        attention(b, i, n_head, n_kv, hd)
        qk_norms(b, i, hd)
    b.norm(tn(T.FFN_NORM, i), (N_EMBD,))


def lfm2(w: gguf.GGUFWriter, b: Builder) -> None:
    n_head, n_ff = 8, 128
    hd = N_EMBD // n_head
    lfm2_hparams(w, n_head, n_ff)
    embeddings(b, tied=True)
    for i, n_kv in enumerate(LFM2_KV_HEADS):
        lfm2_mixer(b, i, n_kv, n_head, hd)
        gated_ffn(b, i, n_ff)
    # LFM2's final norm is named token_embd_norm (llama.cpp's
    # LLM_TENSOR_OUTPUT_NORM_LFM2); the output is the tied embedding.
    b.norm(tn(T.TOKEN_EMBD_NORM), (N_EMBD,), around=TIED_OUT_NORM)


def lfm2_swa(w: gguf.GGUFWriter, b: Builder) -> None:
    """lfm2 with a sliding window, which llama.cpp applies to every
    attention layer."""
    lfm2(w, b)
    w.add_sliding_window(8)


def lfm2moe(w: gguf.GGUFWriter, b: Builder) -> None:
    """LFM2 with routed experts after one dense layer: sigmoid scores, a
    selection bias per expert, renormalised weights."""
    n_head, n_ff = 8, 128
    n_expert, n_used, n_ff_exp = 4, 2, 64
    hd = N_EMBD // n_head
    lfm2_hparams(w, n_head, n_ff)
    w.add_leading_dense_block_count(1)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    embeddings(b, tied=True)
    for i, n_kv in enumerate(LFM2_KV_HEADS):
        lfm2_mixer(b, i, n_kv, n_head, hd)
        if i == 0:
            gated_ffn(b, i, n_ff)
            continue
        # Router logits of RMS 1 keep the sigmoid off its flat ends, where
        # saturated experts would tie.
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, 1.0)
        # Large enough to change which experts win against sigmoid scores.
        b.bias(tn(T.FFN_EXP_PROBS_B, i, "bias"), n_expert, 0.2)
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff_exp, N_EMBD, n_expert, RES_GAIN)
    b.norm(tn(T.TOKEN_EMBD_NORM), (N_EMBD,), around=TIED_OUT_NORM)


# Granite-4.0-H: llama.cpp requires d_inner = 2 n_embd; 16 heads of 32 in
# two groups. Mamba-2, attention, Mamba-2, picked by the KV head counts.
GH_D_INNER, GH_D_STATE, GH_N_GROUP, GH_HEAD_DIM, GH_D_CONV = 2 * N_EMBD, 16, 2, 32, 4
GH_KV_HEADS = (0, 2, 0)


def mamba2_mixer(
    b: Builder,
    i: int,
    d_inner: int,
    d_state: int,
    n_group: int,
    hd: int,
    d_conv: int = GH_D_CONV,
) -> None:
    """One Mamba-2 mixer's tensors (without its pre-norm)."""
    n_head = d_inner // hd
    conv_dim = d_inner + 2 * n_group * d_state
    r = b.rng
    b.mat(tn(T.SSM_IN, i), N_EMBD, d_inner + conv_dim + n_head)  # z, xBC, dt
    b.const(tn(T.SSM_CONV1D, i), 0.4 * r.standard_normal((conv_dim, d_conv)))
    b.bias(tn(T.SSM_CONV1D, i, "bias"), conv_dim)
    # dt = softplus(dt_proj + dt_bias) between 0.05 and 0.5; A = -exp(A_log)
    # in [-8, -1]: the state forgets over a few tokens, not instantly.
    dt = np.exp(r.uniform(math.log(0.05), math.log(0.5), n_head))
    b.const(tn(T.SSM_DT, i, "bias"), np.log(np.expm1(dt)))
    b.const(tn(T.SSM_A, i, ""), -r.uniform(1.0, 8.0, (n_head, 1)))
    b.const(tn(T.SSM_D, i, ""), 1.0 + 0.1 * r.standard_normal((n_head, 1)))
    b.norm(tn(T.SSM_NORM, i), (n_group, d_inner // n_group))
    b.mat(tn(T.SSM_OUT, i), d_inner, N_EMBD, RES_GAIN)


def granitehybrid_common(w: gguf.GGUFWriter, n_ff: int, logit_scale: float) -> None:
    n_head = 8
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(GH_KV_HEADS))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(list(GH_KV_HEADS))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_ssm_conv_kernel(GH_D_CONV)
    w.add_ssm_inner_size(GH_D_INNER)
    w.add_ssm_state_size(GH_D_STATE)
    w.add_ssm_time_step_rank(GH_D_INNER // GH_HEAD_DIM)
    w.add_ssm_group_count(GH_N_GROUP)
    w.add_embedding_scale(4.0)
    w.add_residual_scale(0.5)
    w.add_attention_scale(0.25)  # default would be 1/sqrt(32) ~ 0.177
    w.add_logit_scale(logit_scale)  # logits are divided by it


def granitehybrid(w: gguf.GGUFWriter, b: Builder) -> None:
    """MoE with a shared expert, NoPE (rope.scaling.finetuned false, as
    Granite-4.0-H ships), an attention output bias, tied output."""
    n_head, hd, logit_scale = 8, N_EMBD // 8, 2.0
    n_expert, n_used, n_ff_exp, n_ff_sh = 4, 2, 64, 128
    granitehybrid_common(w, n_ff_exp, logit_scale)
    w.add_rope_scaling_finetuned(False)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_shared_feed_forward_length(n_ff_sh)
    embeddings(b, tied=True)
    for i, n_kv in enumerate(GH_KV_HEADS):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        if n_kv == 0:
            mamba2_mixer(b, i, GH_D_INNER, GH_D_STATE, GH_N_GROUP, GH_HEAD_DIM)
        else:
            attention(b, i, n_head, n_kv, hd, out_bias=True)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, 3.0)
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff_exp, N_EMBD, n_expert, RES_GAIN)
        b.mat(tn(T.FFN_GATE_SHEXP, i), N_EMBD, n_ff_sh)
        b.mat(tn(T.FFN_UP_SHEXP, i), N_EMBD, n_ff_sh)
        b.mat(tn(T.FFN_DOWN_SHEXP, i), n_ff_sh, N_EMBD, RES_GAIN)
    head(b, tied=True, norm=TIED_OUT_NORM * logit_scale)


def granitehybrid_dense(w: gguf.GGUFWriter, b: Builder) -> None:
    """Dense SwiGLU MLPs, RoPE on (no finetuned key: llama.cpp's default),
    q/k/v biases, untied output."""
    n_head, hd, n_ff, logit_scale = 8, N_EMBD // 8, 128, 2.0
    granitehybrid_common(w, n_ff, logit_scale)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    embeddings(b, tied=False)
    for i, n_kv in enumerate(GH_KV_HEADS):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        if n_kv == 0:
            mamba2_mixer(b, i, GH_D_INNER, GH_D_STATE, GH_N_GROUP, GH_HEAD_DIM)
        else:
            attention(b, i, n_head, n_kv, hd, qkv_bias=0.5)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        gated_ffn(b, i, n_ff)
    # The logits are divided by the logit scale: the output norm undoes it.
    b.norm(tn(T.OUTPUT_NORM), (N_EMBD,), around=logit_scale)
    b.mat(tn(T.OUTPUT), N_EMBD, N_VOCAB, OUT_GAIN)


# Jamba: Mamba-1, attention, Mamba-1, picked by the KV head counts. The
# converter's defaults at this width: d_inner = 2 n_embd (llama.cpp
# requires it), d_state 16, dt_rank ceil(n_embd / 16), conv kernel 4.
JAMBA_D_INNER, JAMBA_D_STATE, JAMBA_DT_RANK, JAMBA_D_CONV = 2 * N_EMBD, 16, N_EMBD // 16, 4
JAMBA_KV_HEADS = (0, 2, 0)
# Which layers route to experts (llama.cpp tells them by ffn_gate_inp): the
# attention layer, as Jamba has experts in every other layer from layer 1;
# layers 0 and 2 are dense.
JAMBA_MOE_LAYERS = (1,)


def mamba1_mixer(b: Builder, i: int) -> None:
    """One Mamba-1 mixer's tensors as Jamba has them (without its pre-norm)."""
    di, ds, rank = JAMBA_D_INNER, JAMBA_D_STATE, JAMBA_DT_RANK
    r = b.rng
    b.mat(tn(T.SSM_IN, i), N_EMBD, 2 * di)  # x, z
    b.const(tn(T.SSM_CONV1D, i), 0.4 * r.standard_normal((di, JAMBA_D_CONV)))
    b.bias(tn(T.SSM_CONV1D, i, "bias"), di)
    b.mat(tn(T.SSM_X, i), di, rank + 2 * ds)  # dt's input, B, C
    b.norm(tn(T.SSM_DT_NORM, i), (rank,))
    b.norm(tn(T.SSM_B_NORM, i), (ds,))
    b.norm(tn(T.SSM_C_NORM, i), (ds,))
    b.mat(tn(T.SSM_DT, i), rank, di, 0.5)
    # softplus(dt_proj + bias) mostly between 0.05 and 0.5, and A = -exp(A_log)
    # in [-8, -0.5] per channel and state: the state forgets over a few
    # tokens, each state at its own rate.
    dt = np.exp(r.uniform(math.log(0.05), math.log(0.5), di))
    b.const(tn(T.SSM_DT, i, "bias"), np.log(np.expm1(dt)))
    b.const(tn(T.SSM_A, i, ""), -r.uniform(0.5, 8.0, (di, ds)))
    b.const(tn(T.SSM_D, i, ""), 1.0 + 0.1 * r.standard_normal(di))
    b.mat(tn(T.SSM_OUT, i), di, N_EMBD, RES_GAIN)


def jamba(w: gguf.GGUFWriter, b: Builder, *, fused: bool = False) -> None:
    """Mamba-1 and attention layers (no RoPE), dense and routed MLPs,
    untied output, with the keys JambaModel's converter writes. ``fused``:
    the options llama.cpp's loader takes beside them, a fused ``attn_qkv``
    with its bias and no ``output`` (the embedding is the head)."""
    n_head, n_ff, n_expert, n_used = 8, 128, 4, 2
    hd = N_EMBD // n_head
    w.add_block_count(len(JAMBA_KV_HEADS))
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(list(JAMBA_KV_HEADS))
    w.add_ssm_conv_kernel(JAMBA_D_CONV)
    w.add_ssm_inner_size(JAMBA_D_INNER)
    w.add_ssm_state_size(JAMBA_D_STATE)
    w.add_ssm_time_step_rank(JAMBA_DT_RANK)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    embeddings(b, tied=fused)
    for i, n_kv in enumerate(JAMBA_KV_HEADS):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        if n_kv == 0:
            mamba1_mixer(b, i)
        elif fused:
            attention(b, i, n_head, n_kv, hd, fused=True)
            # 0.3: at 0.5 one token's routing sat on a near tie that the
            # engines' 8-bit activations broke apart (a logit moved by 1.4).
            b.bias(tn(T.ATTN_QKV, i, "bias"), (n_head + 2 * n_kv) * hd, 0.3)
        else:
            attention(b, i, n_head, n_kv, hd)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        if i not in JAMBA_MOE_LAYERS:
            gated_ffn(b, i, n_ff)
            continue
        # Router logits of RMS 3, as qwen3moe's: the top two take most of
        # the mass, which their weights keep (no renormalization), and near
        # ties between the second and third expert are rare. F32, as
        # llama-quantize leaves routers: with 8-bit activations in the
        # router, one near tie flipped by them moved a logit by 1.4.
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, 3.0, cycled=False)
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff, n_expert)
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff, n_expert)
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff, N_EMBD, n_expert, RES_GAIN)
    head(b, tied=fused)


def jamba_fused(w: gguf.GGUFWriter, b: Builder) -> None:
    jamba(w, b, fused=True)


def olmo2(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, n_ff = 2, 8, 2, 128
    hd = N_EMBD // n_head
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, rope_base=500000.0)
    embeddings(b, tied=False)
    for i in range(n_layer):
        attention(b, i, n_head, n_kv, hd)
        # Norms over all heads at once, with no pre-norm: the post-norms
        # set the scale.
        b.norm(tn(T.ATTN_Q_NORM, i), (n_head * hd,), around=1.5)
        b.norm(tn(T.ATTN_K_NORM, i), (n_kv * hd,), around=1.5)
        b.norm(tn(T.ATTN_POST_NORM, i), (N_EMBD,), around=POST_NORM)
        gated_ffn(b, i, n_ff)
        b.norm(tn(T.FFN_POST_NORM, i), (N_EMBD,), around=POST_NORM)
    head(b, tied=False)


def qwen3moe(w: gguf.GGUFWriter, b: Builder) -> None:
    n_layer, n_head, n_kv, hd = 2, 4, 2, 32
    n_expert, n_used, n_ff_exp = 4, 2, 64
    hparams(w, n_layer, n_head, n_kv, n_ff_exp * n_used, rms_eps=1e-6, rope_base=1e6, head_dim=hd)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    embeddings(b, tied=False)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, hd)
        qk_norms(b, i, hd)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        # A router with a wide spread, so the top-2 choice is clear-cut.
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, 3.0)
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff_exp, N_EMBD, n_expert, RES_GAIN)
    head(b, tied=False)


def smollm3(w: gguf.GGUFWriter, b: Builder) -> None:
    # Four layers: llama.cpp skips RoPE on every fourth (layer 3 here).
    n_layer, n_head, n_kv, n_ff = 4, 8, 2, 128
    hd = N_EMBD // n_head
    hparams(w, n_layer, n_head, n_kv, n_ff, rms_eps=1e-6, rope_base=5e6)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(hd)
    embeddings(b, tied=True)
    dense_layers(b, n_layer, n_head, n_kv, hd, n_ff)
    head(b, tied=True)


def gpt_oss(w: gguf.GGUFWriter, b: Builder) -> None:
    # Three layers: 0 and 2 in the sliding window (llama.cpp's default
    # pattern of 2), 1 global. Heads of 64 as the real model, so the q
    # projection (512) is wider than the residual (256).
    n_layer, n_head, n_kv, hd = 3, 8, 2, 64
    n_expert, n_used, n_ff_exp = 4, 2, 64
    hparams(w, n_layer, n_head, n_kv, n_ff_exp, rope_base=150000.0, head_dim=hd)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_sliding_window(8)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(16)
    embeddings(b, tied=False)
    r = b.rng
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        attention(b, i, n_head, n_kv, hd, qkv_bias=0.5, out_bias=True)
        # Sink logits around the scores' own range: each takes a share of
        # the softmax that varies with the query.
        b.const(tn(T.ATTN_SINKS, i), r.uniform(-1.0, 3.0, n_head))
        b.norm(tn(T.ATTN_POST_NORM, i), (N_EMBD,))
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, 3.0)
        b.bias(tn(T.FFN_GATE_INP, i, "bias"), n_expert, 1.0)
        # Gate and up wide enough (std 4) that the clamp at 7 bites.
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff_exp, n_expert, 4.0)
        b.const(tn(T.FFN_GATE_EXP, i, "bias"), 0.5 * r.standard_normal((n_expert, n_ff_exp)))
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff_exp, n_expert, 4.0)
        b.const(tn(T.FFN_UP_EXP, i, "bias"), 0.5 * r.standard_normal((n_expert, n_ff_exp)))
        # The clamped SwiGLU's outputs run to ~60: a small down keeps the
        # branch near the others.
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff_exp, N_EMBD, n_expert, RES_GAIN / 8)
        b.const(tn(T.FFN_DOWN_EXP, i, "bias"), 0.1 * r.standard_normal((n_expert, N_EMBD)))
    head(b, tied=False)


# DeepSeek-V2's MLA: 4 heads whose queries are 32 nope + 32 rope wide, a
# latent of 64 (cached with the 32 rope dims: 96 per token and layer),
# values of 32 per head.
DS_HEADS, DS_NOPE, DS_ROPE, DS_KV_LORA, DS_V = 4, 32, 32, 64, 32


def deepseek2_common(
    w: gguf.GGUFWriter, b: Builder, *, q_lora: int, log_mul: float, router_gain: float
) -> None:
    """Three layers: a dense SwiGLU first, then 4 routed experts (top 2)
    beside 2 shared experts; YaRN x4 from 16 tokens with DeepSeek's
    log-multiplier (written as the converter does, times 0.1)."""
    n_layer, n_ff = 3, 128
    n_expert, n_used, n_ff_exp, n_shared = 4, 2, 64, 2
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(DS_HEADS)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(N_VOCAB)
    w.add_leading_dense_block_count(1)
    # llama.cpp reads q_lora_rank for every size but V2-Lite's 27 layers;
    # 0 means a direct attn_q.
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(DS_KV_LORA)
    w.add_key_length(DS_KV_LORA + DS_ROPE)
    w.add_value_length(DS_KV_LORA)
    w.add_key_length_mla(DS_NOPE + DS_ROPE)
    w.add_value_length_mla(DS_V)
    w.add_rope_dimension_count(DS_ROPE)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_count(n_shared)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(16)
    w.add_rope_scaling_yarn_log_mul(0.1 * log_mul)
    embeddings(b, tied=False)
    q_width = DS_HEADS * (DS_NOPE + DS_ROPE)
    for i in range(n_layer):
        b.norm(tn(T.ATTN_NORM, i), (N_EMBD,))
        if q_lora:
            b.mat(tn(T.ATTN_Q_A, i), N_EMBD, q_lora)
            b.norm(tn(T.ATTN_Q_A_NORM, i), (q_lora,))
            b.mat(tn(T.ATTN_Q_B, i), q_lora, q_width, QK_GAIN)
        else:
            b.mat(tn(T.ATTN_Q, i), N_EMBD, q_width, QK_GAIN)
        b.mat(tn(T.ATTN_KV_A_MQA, i), N_EMBD, DS_KV_LORA + DS_ROPE, QK_GAIN)
        b.norm(tn(T.ATTN_KV_A_NORM, i), (DS_KV_LORA,))
        b.mat3(tn(T.ATTN_K_B, i), DS_NOPE, DS_KV_LORA, DS_HEADS)
        b.mat3(tn(T.ATTN_V_B, i), DS_KV_LORA, DS_V, DS_HEADS)
        b.mat(tn(T.ATTN_OUT, i), DS_HEADS * DS_V, N_EMBD, RES_GAIN)
        b.norm(tn(T.FFN_NORM, i), (N_EMBD,))
        if i == 0:
            gated_ffn(b, i, n_ff)
            continue
        b.mat(tn(T.FFN_GATE_INP, i), N_EMBD, n_expert, router_gain)
        b.mat3(tn(T.FFN_GATE_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_UP_EXP, i), N_EMBD, n_ff_exp, n_expert)
        b.mat3(tn(T.FFN_DOWN_EXP, i), n_ff_exp, N_EMBD, n_expert, RES_GAIN)
        b.mat(tn(T.FFN_GATE_SHEXP, i), N_EMBD, n_shared * n_ff_exp)
        b.mat(tn(T.FFN_UP_SHEXP, i), N_EMBD, n_shared * n_ff_exp)
        b.mat(tn(T.FFN_DOWN_SHEXP, i), n_shared * n_ff_exp, N_EMBD, RES_GAIN)
    head(b, tied=False)


def deepseek2(w: gguf.GGUFWriter, b: Builder) -> None:
    """DeepSeek-V2 / Moonlight style: the query through its low rank (96)
    and norm; sigmoid router scores with a selection bias, renormalised
    and scaled by 2.5."""
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_norm(True)
    w.add_expert_weights_scale(2.5)
    # Router logits of RMS 1 keep the sigmoid off its flat ends, where
    # saturated experts would tie.
    deepseek2_common(w, b, q_lora=96, log_mul=0.707, router_gain=1.0)
    for i in (1, 2):
        b.bias(tn(T.FFN_EXP_PROBS_B, i, "bias"), 4, 0.2)


def deepseek2_lite(w: gguf.GGUFWriter, b: Builder) -> None:
    """DeepSeek-V2-Lite style: a direct attn_q; softmax router weights
    neither renormalised nor scaled (no such keys)."""
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    # A wide router spread: the top-2 choice is clear-cut.
    deepseek2_common(w, b, q_lora=0, log_mul=1.0, router_gain=3.0)


def llama_one_type(w: gguf.GGUFWriter, b: Builder) -> None:
    """A plain llama whose every matrix, token embedding and output
    included, can hold a 256-element block: n_ff 256, untied output."""
    n_layer, n_head, n_kv, n_ff = 2, 8, 2, 256
    hd = N_EMBD // n_head
    hparams(w, n_layer, n_head, n_kv, n_ff, rope_base=10000.0)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(hd)
    embeddings(b, tied=False)
    dense_layers(b, n_layer, n_head, n_kv, hd, n_ff)
    head(b, tied=False)


# llama.cpp's ftype for a file mostly in each type (MXFP4 has only the MoE
# mix, whose dense matrices llama-quantize leaves at Q8_0).
ONE_TYPE_FILE_TYPES: dict[Q, FT] = {
    Q.IQ4_NL: FT.MOSTLY_IQ4_NL,
    Q.IQ4_XS: FT.MOSTLY_IQ4_XS,
    Q.IQ3_S: FT.MOSTLY_IQ3_S,
    Q.IQ3_XXS: FT.MOSTLY_IQ3_XXS,
    Q.IQ2_S: FT.MOSTLY_IQ2_S,
    Q.IQ2_XS: FT.MOSTLY_IQ2_XS,
    Q.IQ2_XXS: FT.MOSTLY_IQ2_XXS,
    Q.IQ1_S: FT.MOSTLY_IQ1_S,
    Q.IQ1_M: FT.MOSTLY_IQ1_M,
    Q.TQ1_0: FT.MOSTLY_TQ1_0,
    Q.TQ2_0: FT.MOSTLY_TQ2_0,
    Q.MXFP4: FT.MOSTLY_MXFP4_MOE,
}

# One llama per new weight type, and gpt-oss's layout of MXFP4 experts.
TYPE_FIXTURES: dict[str, Fixture] = {
    f.name: f
    for f in (
        *(
            Fixture(
                t.name.lower(),
                "llama",
                llama_one_type,
                f"every matrix {t.name} (token embedding and output included); GQA 8/2, n_ff 256",
                weight_type=t,
                file_type=ft,
            )
            for t, ft in ONE_TYPE_FILE_TYPES.items()
        ),
        Fixture(
            "qwen3moe-mxfp4",
            "qwen3moe",
            qwen3moe,
            "the qwen3moe fixture's layout with MXFP4 experts (as gpt-oss ships), "
            "every other matrix Q8_0",
            weight_type=Q.MXFP4,
            experts_only=True,
            file_type=FT.MOSTLY_MXFP4_MOE,
        ),
    )
}

FIXTURES: dict[str, Fixture] = {
    f.name: f
    for f in (
        Fixture(
            "llama",
            "llama",
            llama,
            "GQA 8/2; linear rope scaling x2 plus Llama-3 rope_freqs factors; "
            "untied output. Partial rotary is refused by llama.cpp for llama",
        ),
        Fixture(
            "mistral3",
            "mistral3",
            mistral3,
            "GQA 4/2, head_dim 32 != 256/4; YaRN x4 from 16 tokens with beta_fast 16, "
            "beta_slow 2, yarn_log_multiplier 0.707; Llama-4 attention temperature 0.1",
        ),
        Fixture(
            "qwen2",
            "qwen2",
            qwen2,
            "GQA 8/2; q/k/v biases; YaRN x4 from 32 tokens; tied output",
        ),
        Fixture(
            "qwen3",
            "qwen3",
            qwen3,
            "GQA 4/2, head_dim 32 != 256/4; per-head q/k RMSNorm; tied output",
        ),
        Fixture(
            "gemma",
            "gemma",
            gemma,
            "MQA 4/1, head_dim 32; embedding x sqrt(n_embd); GeGLU; norms stored as 1+w",
        ),
        Fixture(
            "gemma2",
            "gemma2",
            gemma2,
            "GQA 4/2, head_dim 32 (q scaled by 1/sqrt(32)); attention softcap 4, final "
            "softcap 15; sliding window 8 on layer 0, global layer 1; post-attention and "
            "post-FFN norms; GeGLU",
        ),
        Fixture(
            "gemma3",
            "gemma3",
            gemma3,
            "3 layers: sliding window 8 on layers 0-1 (rope base 1e4), global layer 2 "
            "(rope base 1e6, linear x8); per-head q/k norms; post-norms; MQA 4/1",
        ),
        Fixture(
            "gemma3n",
            "gemma3n",
            gemma3n,
            "22 layers of width 64 (llama.cpp fixes the first 20 as the ones with a KV "
            "cache): layers 20 (sliding) and 21 (global) reuse layers 18's and 19's; "
            "4 AltUp streams with router, predict and correct; LAuReL rank 64; "
            "per-layer inputs of 256; the gaussian top-k gate sparsity on layers 0-9; "
            "sliding window 8 with every fifth layer global (rope bases 1e4 / 1e6); "
            "q/k norms and a weightless v norm; final softcap 30; tied output",
        ),
        Fixture(
            "phi3",
            "phi3",
            phi3,
            "fused attn_qkv; fused gate|up in ffn_up; partial rotary 24 of 32; LongRoPE "
            "short/long factors with original context 256 and attn_factor; sliding_window "
            "16 in the metadata (llama.cpp disables it)",
            n_ctx=(256, 512),
        ),
        Fixture(
            "command-r",
            "command-r",
            command_r,
            "LayerNorm (no bias); parallel attention + FFN; logit_scale 0.25; tied output",
        ),
        Fixture(
            "starcoder2",
            "starcoder2",
            starcoder2,
            "LayerNorm with bias; GELU MLP (up/down); biases on q/k/v/o/up/down and the "
            "output norm",
        ),
        Fixture(
            "granite",
            "granite",
            granite,
            "embedding_scale 4, residual_scale 0.5, attention.scale 0.25, logit_scale 2; "
            "tied output",
        ),
        Fixture(
            "mamba2",
            "mamba2",
            mamba2,
            "d_inner 128, d_state 16, 2 groups, 4 heads of 32, conv kernel 4; gated "
            "grouped RMSNorm",
        ),
        Fixture(
            "olmo2",
            "olmo2",
            olmo2,
            "no pre-norms; q/k RMSNorm over all heads; post-attention and post-FFN norms",
        ),
        Fixture(
            "qwen3moe",
            "qwen3moe",
            qwen3moe,
            "4 experts, top-2 with renormalised softmax weights; per-head q/k norms",
        ),
        Fixture(
            "gpt-oss",
            "gpt-oss",
            gpt_oss,
            "3 layers: sliding window 8 on layers 0 and 2, layer 1 global; YaRN x4 from 16 "
            "tokens on both kinds; attention sinks; q/k/v/o biases; head_dim 64 (q 512 wide); "
            "4 MXFP4 experts, top-2 router logits (with bias) softmaxed; expert biases; "
            "clamped SwiGLU (alpha 1.702, limit 7); NeoX rope; untied output",
            experts_type=Q.MXFP4,
        ),
        Fixture(
            "smollm3",
            "smollm3",
            smollm3,
            "4 layers, layer 3 without RoPE (llama.cpp's fixed interval of 4); GQA 8/2; "
            "tied output",
        ),
        Fixture(
            "lfm2",
            "lfm2",
            lfm2,
            "short-convolution layers 0 and 2 (kernel 3, B x gated by C, state carried), "
            "attention layer 1 (GQA 8/2, per-head q/k RMSNorm, NEOX rope); SwiGLU; tied "
            "output after token_embd_norm",
        ),
        Fixture(
            "granitehybrid",
            "granitehybrid",
            granitehybrid,
            "Mamba-2 layers 0 and 2 (d_inner 512 = 2 n_embd, 16 heads of 32 in 2 groups), "
            "attention layer 1 (GQA 8/2, output bias, NoPE: rope.scaling.finetuned false); "
            "4 experts top-2 plus a shared expert; embedding x4, residual x0.5, attention "
            "scale 0.25, logits / 2; tied output",
        ),
        Fixture(
            "granitehybrid_dense",
            "granitehybrid",
            granitehybrid_dense,
            "as granitehybrid with dense SwiGLU MLPs, RoPE on, q/k/v biases, untied output",
        ),
        Fixture(
            "lfm2moe",
            "lfm2moe",
            lfm2moe,
            "lfm2's layers; a dense SwiGLU in layer 0, then 4 experts top-2 with sigmoid "
            "scores, a per-expert selection bias (exp_probs_b) and renormalised weights",
        ),
        Fixture(
            "deepseek2",
            "deepseek2",
            deepseek2,
            "MLA: q through q_a (96), its RMSNorm and q_b; latent 64 RMS-normed and 32 rope "
            "dims cached (96 per token and layer), absorbed through attn_k_b / attn_v_b; 4 "
            "heads of 32+32, values 32; YaRN x4 from 16 tokens, yarn_log_multiplier "
            "0.0707; dense SwiGLU layer 0, then 4 experts top-2 with sigmoid scores, "
            "exp_probs_b, renormalised, x2.5, and 2 shared experts",
        ),
        Fixture(
            "deepseek2_lite",
            "deepseek2",
            deepseek2_lite,
            "as deepseek2 with a direct attn_q (q_lora_rank 0, V2-Lite), softmax router "
            "weights not renormalised, no scale, yarn_log_multiplier 0.1",
        ),
        Fixture(
            "lfm2_swa",
            "lfm2",
            lfm2_swa,
            "lfm2 with attention.sliding_window 8 on its attention layer",
        ),
        Fixture(
            "jamba",
            "jamba",
            jamba,
            "Mamba-1 layers 0 and 2 (d_inner 512 = 2 n_embd, d_state 16, dt_rank 16, conv "
            "kernel 4; dt, B and C RMS-normed; A per channel and state), attention layer 1 "
            "(GQA 8/2, no RoPE); dense SwiGLU in layers 0 and 2, 4 experts top-2 with "
            "softmax weights not renormalized in layer 1; untied output",
        ),
        Fixture(
            "jamba_fused",
            "jamba",
            jamba_fused,
            "as jamba with a fused attn_qkv and its bias, tied output (no output.weight)",
        ),
    )
}

# Every fixture make_fixtures.py writes: the 13-format cycle ones, then
# the one-type ones.
ALL_FIXTURES: dict[str, Fixture] = {**FIXTURES, **TYPE_FIXTURES}
