"""The pattern catalogue as data: pattern id -> matcher ``(GraphIndex, anchor node) -> Match |
Reject | None``, in priority order (an earlier pattern claims nodes first)."""

from ortfuse.fusion.catalogue import PATTERN_IDS
from ortfuse.fusion.patterns.conv import match_conv_add_relu, match_conv_bn_relu
from ortfuse.fusion.patterns.eltwise import match_add_relu, match_eltwise_chain, match_hardswish, match_silu_pattern
from ortfuse.fusion.patterns.gemm import match_gemm_relu_gelu

MATCHERS = {
    "conv_add_relu": match_conv_add_relu,
    "conv_bn_relu": match_conv_bn_relu,
    "gemm_relu_gelu": match_gemm_relu_gelu,
    "add_relu": match_add_relu,
    "hardswish": match_hardswish,
    "silu": match_silu_pattern,
    "eltwise_chain": match_eltwise_chain,
}
assert tuple(MATCHERS) == PATTERN_IDS
