"""The layout step of a plan: the fused model optimized by ORT itself (ORT_ENABLE_ALL, its NCHWc
transformer blocking the convolutional regions), then the ops ORT left between reorder pairs run
blocked by ortfuse: squeeze-excite scales (``blocked_scale``), then the regions of layout-agnostic
ops (``regions``: elementwise ops, channel Concat/Split, nearest Resize), then 3x3 convs as native
Winograd kernels and stride-2 ConvTransposes read from blocks where they measure faster here
(``winograd``, ``deconv``), then squeeze-excite blocks as one native op (``se_block``), 1x1 convs
with their QuickGelu as one native op (``pointwise``) and depthwise convs as native kernels where
they do (``depthwise``). All of that is done twice when some conv's
channels are off the block: on the fused model and on it with those channels padded to whole blocks
(``channel_padding``), and the padded form is kept where the two whole graphs time it faster. What
is timed runs at the input sizes the session serves where they are named (``served_sizes``: the
``ortfuse.tune_dims`` entry, or the sizes an auto tuning measured on); a conv whose sizes are unknown
stays with ORT. The graph ORT writes is what the session loads; reloading it at any optimization
level gives the same graph, and it holds for this machine only (the block size is this CPU's), as
every plan does (the plan cache is keyed by the CPU).

``plan_layout`` returns None with the reason whenever the step does not apply or does not help: ORT
blocks nothing here, the session does not optimize at ORT_ENABLE_ALL, the fused model holds
reference (Python-op) kernels or is too large to round-trip, it has no op the step could move (then
ORT is not asked to optimize it), or no op was moved onto blocks.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from ortfuse.fusion.discontinuity import deciding_tensors
from ortfuse.ir.graph import GraphIndex
from ortfuse.layout import (
    blocked_scale,
    channel_padding,
    deconv,
    depthwise,
    op_timing,
    pointwise,
    regions,
    se_block,
    served_sizes,
    winograd,
)
from ortfuse.layout.probe import block_size

MAX_BYTES = 1 << 30  # a larger model is not written out and read back a second time
ENV = "ORTFUSE_LAYOUT"  # off/0/false/no: plans keep the fused model as ORT optimizes it


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


@dataclass
class Layout:
    model: onnx.ModelProto  # the graph ORT optimized, with ortfuse's blocked ops
    native_ops: frozenset  # the native op types the layout added
    note: str  # for the report: block size, ops moved onto blocks, reorders before and after


def plan_layout(original: onnx.ModelProto, fused: onnx.ModelProto, sess_options, native_ops: frozenset,
                disabled_optimizers=(), data: bytes | None = None) -> tuple[Layout | None, str]:
    """(layout, "") or (None, why the layout step leaves the fused model as it is). ``original``: the
    model before fusion, whose shapes name the tensors around the reorders (fused ops have none)."""
    import onnxruntime as ort

    if not enabled():
        return None, f"layout: {ENV}=off"
    every = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if (sess_options.graph_optimization_level if sess_options is not None else every) != every:
        return None, "layout: the session does not run ORT's layout optimizations (ORT_ENABLE_ALL)"
    ops = {n.op_type for n in fused.graph.node}
    if not {"Conv", "FusedConv"} & ops:  # no conv region: nothing to plan
        return None, "layout: no convolution to run blocked"
    block = block_size()
    if not block:
        return None, "layout: ORT has no NCHWc blocked kernels on this CPU"
    data = data if data is not None else fused.SerializeToString()
    if len(data) > MAX_BYTES:
        return None, "layout: the model is too large to optimize twice"
    index = GraphIndex(original)
    shape = index.shape  # dims from ONNX shape inference, as the matchers see them
    deciding = _deciding_output(index)
    if deciding:
        return None, (f"layout: {deciding}, a discontinuous op, and ortfuse's blocked kernels are not "
                      "bit-exact with ORT: ORT's own layout runs")
    if not any(blocked_scale.scale_shapes(n, shape) if n.op_type == "Mul" else
               regions.may_move(n) or n.op_type == "ConvTranspose" or winograd.may_replace(n, fused.graph)
               or pointwise.may_replace(n, fused.graph)
               or depthwise.may_replace(n, fused.graph)
               for n in fused.graph.node):
        return None, ("layout: no op ORT leaves between reorders that ortfuse runs blocked (channel scale, "
                      "native elementwise op, Split, Concat, Resize, ConvTranspose) and no 3x3 or depthwise conv")
    threads = sess_options.intra_op_num_threads if sess_options is not None else 0
    served, named, dims_note = _served_shape(original, sess_options)
    plain, why_not = _blocked(data, fused, shape, block, native_ops, disabled_optimizers, threads)
    padded, padded_model, padding = None, fused, channel_padding.PaddingResult()
    if padding_mode() != "off":
        padded_model, padding = channel_padding.pad_channels(fused, block, shape)
    if padded_model is not fused:
        padded, _ = _blocked(padded_model.SerializeToString(), padded_model, padding.shape_of(shape), block,
                             native_ops, disabled_optimizers, threads)
    if padded is not None and (plain is None or _padding_wins(plain, padded, original, native_ops, threads, named)):
        chosen, done = padded, [padding.summary()]
        _native_convs(chosen, padding.shape_of(shape), block, threads,
                      padding.shape_of(served) if served is not None else None)
    elif plain is None:
        return None, why_not
    else:
        chosen, done = plain, []
        _native_convs(chosen, shape, block, threads, served)
    done += chosen.done
    if not done:
        return None, f"layout: nothing for ortfuse to run blocked ({chosen.before} reorders left by ORT){chosen.failed}"
    extra_inputs = _prune_stray_inputs(chosen.graph.graph, fused.graph)
    if extra_inputs:
        return None, f"layout: ORT's optimized graph asks for inputs the model does not have ({extra_inputs[0]})"
    after = blocked_scale.reorder_count(chosen.graph.graph)
    left = ", ".join(f"{n} at {op}" for op, n in sorted(regions.reorders_left(chosen.graph.graph, block).items()))
    if served is None and not dims_note:
        dims_note = _unsized_hint(chosen.graph.graph, padding.shape_of(shape) if chosen is padded else shape, original)
    note = (f"layout: NCHWc blocks of {block}; {'; '.join(done)}; reorders {chosen.before} -> {after}"
            + (f" (left where a region meets {left})" if left else "") + chosen.failed + dims_note)
    return Layout(chosen.graph, chosen.native, note), ""


@dataclass
class _Blocked:
    """ORT's optimized graph of one form of the fused model with ortfuse's blocked ops in it."""

    graph: onnx.ModelProto
    native: frozenset  # the native op types the rewrites added
    done: list  # one summary per rewrite that changed the graph
    before: int  # reorders in ORT's graph before the rewrites
    failed: str  # "; <rewrite> left to ORT (<error>)" for each rewrite that raised


def _blocked(data: bytes, fused: onnx.ModelProto, shape, block: int, native_ops: frozenset, disabled_optimizers,
             threads: int) -> tuple[_Blocked | None, str]:
    """ORT's optimization of ``data`` (``fused`` serialized) with the untimed blocked rewrites applied
    (channel scales, regions), or None and why ORT could not optimize it. ``shape``: dims by tensor
    name, as the rewrites read them."""
    import onnxruntime as ort

    from ortfuse.foundation.session_options import make_options
    from ortfuse.kernel_choice.op_registration import with_custom_ops

    with tempfile.TemporaryDirectory() as tmp:
        so = make_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        so.log_severity_level = 3
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so, why_not = with_custom_ops(so, native_ops | {blocked_scale.OP}, python_ops=False)
        if why_not:
            return None, f"layout: {why_not}"
        extra = {"disabled_optimizers": set(disabled_optimizers)} if disabled_optimizers else {}
        try:
            ort.InferenceSession(data, so, providers=["CPUExecutionProvider"], **extra)
            optimized = onnx.load(so.optimized_model_filepath)
        except Exception as exc:  # never worse than the fused plan: keep it
            return None, f"layout: ORT could not optimize the fused model ({type(exc).__name__})"
    before = blocked_scale.reorder_count(optimized.graph)
    moved = blocked_scale.block_channel_scales(optimized.graph, shape, block)
    failed = ""
    try:  # the graph is changed only when the rewrite of the regions is complete
        grown = regions.run_blocked_regions(optimized.graph, shape, block)
    except Exception as exc:  # never worse than the plan without regions
        grown, failed = regions.RegionResult(), f"; regions left to ORT ({type(exc).__name__}: {exc})"
    done = [f"{moved} squeeze-excite scale(s) run blocked ({blocked_scale.OP})"] if moved else []
    done += [grown.summary()] if grown.regions else []
    native = frozenset({blocked_scale.OP} if moved else set()) | frozenset(grown.native_ops)
    return _Blocked(optimized, native, done, before, failed), ""


def _native_convs(chosen: _Blocked, shape, block: int, threads: int, served=None) -> None:
    """The rewrites timed op by op on this machine, applied to ``chosen`` (its graph, native ops, summaries
    and failures updated): Winograd 3x3 convs, stride-2 ConvTransposes, squeeze-excite blocks as one op,
    1x1 convs with their QuickGelu, depthwise convs. Run on the form the plan keeps only: their probes
    are the costly part of planning.
    ``served``: the shapes at the dims the session serves (``_served_shape``), which the probes are
    timed at; the rewrites' legality is proved on ``shape`` alone."""
    optimized, failed = chosen.graph, ""
    sized = served if served is not None else shape
    cold = op_timing.weights_exceed_cache(optimized.graph)  # probes timed as the model's runs find the filters
    try:
        wino = winograd.run_winograd(optimized.graph, shape, block, winograd.decider(block, threads, cold), served)
    except Exception as exc:  # never worse than the plan without them
        wino, failed = winograd.WinogradResult(), failed + f"; convs left to ORT ({type(exc).__name__}: {exc})"
    try:
        hw = winograd.spatial_dims(optimized.graph, sized)
        up = deconv.run_deconv(optimized.graph, hw, block, deconv.decider(block, threads, cold))
    except Exception as exc:  # never worse than the plan without them
        up, failed = deconv.DeconvResult(), failed + f"; ConvTransposes left to ORT ({type(exc).__name__}: {exc})"
    try:
        se = se_block.run_se_blocks(optimized.graph, shape, block, se_block.decider(block, threads, cold), served)
    except Exception as exc:  # never worse than the plan without them
        se, failed = se_block.SEResult(), failed + f"; squeeze-excite blocks left to ORT ({type(exc).__name__}: {exc})"
    try:  # after the SE blocks: an SE's first FC with its SiLU goes with the whole SE where that wins
        pw = pointwise.run_pointwise(optimized.graph, winograd.spatial_dims(optimized.graph, sized), block,
                                     pointwise.decider(block, threads, cold))
    except Exception as exc:  # never worse than the plan without them
        pw, failed = pointwise.PointwiseResult(), failed + f"; 1x1 convs left to ORT ({type(exc).__name__}: {exc})"
    try:
        dw = depthwise.run_depthwise(optimized.graph, winograd.spatial_dims(optimized.graph, sized), block,
                                     depthwise.decider(block, threads, cold))
    except Exception as exc:  # never worse than the plan without them
        dw = depthwise.DepthwiseResult()
        failed += f"; depthwise convs left to ORT ({type(exc).__name__}: {exc})"
    chosen.done += [wino.summary()] if wino.replaced else []
    chosen.done += [up.summary()] if up.replaced else []
    chosen.done += [se.summary()] if se.summary() else []
    chosen.done += [pw.summary()] if pw.replaced else []
    chosen.done += [dw.summary()] if dw.summary() else []
    chosen.native = (chosen.native | frozenset(wino.ops()) | frozenset(up.ops()) | frozenset(se.ops())
                     | frozenset({depthwise.OP} if dw.replaced else set())
                     | frozenset(pw.ops()))
    chosen.failed += failed


PADDING_ENV = "ORTFUSE_CHANNEL_PADDING"
PADDING_MARGIN = 0.95  # the padded form must take below this share of the unpadded form's time
PADDING_BUDGET_S = 0.2  # seconds of runs of each form per repeat (a small model's run is a millisecond)


def padding_mode() -> str:
    """``ORTFUSE_CHANNEL_PADDING``: off (never pad) | on (pad wherever a conv's channels allow, no
    timing) | measure (the default: keep the padded form only where it measures faster)."""
    mode = os.environ.get(PADDING_ENV, "measure").strip().lower()
    return "off" if mode in ("0", "off", "false", "no") else "on" if mode in ("1", "on", "true", "yes") else "measure"


def _padding_wins(plain: _Blocked, padded: _Blocked, original: onnx.ModelProto, native_ops: frozenset,
                  threads: int, named: dict[str, int]) -> bool:
    """Whether the padded form runs below ``PADDING_MARGIN`` times the unpadded one in every repeat,
    both whole graphs timed interleaved at the session's thread count (``op_timing.native_faster``,
    the choice kept per machine). Inputs at the model's declared dims and those ``named``
    (``ortfuse.tune_dims``); a dim without a value: 1 for the first (the batch),
    ``ir.feeds.DEFAULT_DIM`` for the others. A model with a non-float input is not timed and keeps
    the unpadded form, as does one whose timing fails. ``native_ops``: the fused model's own native
    ops, in both forms."""
    from ortfuse.ir.feeds import FeedError, concrete_shape, declared_inputs

    if padding_mode() == "on":
        return True
    try:
        declared = declared_inputs(original)
    except FeedError:  # an input without a declared tensor shape: nothing to time at
        return False
    if any(elem != onnx.TensorProto.FLOAT for _, elem, _ in declared):
        return False
    shapes = {name: tuple(concrete_shape(dims, named.get("batch", 1), named)) for name, _, dims in declared}
    cold = op_timing.weights_exceed_cache(plain.graph.graph)
    try:
        return op_timing.native_faster(plain.graph.SerializeToString(), padded.graph.SerializeToString(),
                                       native_ops | padded.native, shapes, threads, PADDING_MARGIN,
                                       stock_ops=native_ops | plain.native, cold=cold, budget_s=PADDING_BUDGET_S)
    except Exception:  # never worse than the unpadded plan
        return False


def _served_shape(original: onnx.ModelProto, sess_options) -> tuple[Callable[[str], list | None] | None,
                                                                    dict[str, int], str]:
    """(the shapes of ``original``'s tensors with the dims the ``ortfuse.tune_dims`` entry names
    fixed (the session's, else the one its auto tuning measured on: ``served_sizes.entry``), or None
    when it names none of the model's dynamic dims; those dims; a note for the report when the entry
    could not be used). The layout's native convs are timed at these shapes; the plan keeps every
    dim the model declares dynamic, and runs at any size."""
    from ortfuse.foundation.session_options import DIMS_KEY
    from ortfuse.ir.feeds import FeedError, with_named_dims
    from ortfuse.ir.model_args import ModelArgError, parse_dims

    try:
        named = parse_dims(served_sizes.entry(sess_options))
        fixed = with_named_dims(original, named) if named else None
    except (ModelArgError, FeedError) as exc:
        return None, {}, f"; the {DIMS_KEY} entry was not used ({exc})"
    if fixed is None:
        return None, named, ""
    return GraphIndex(fixed).shape, named, ""


def _unsized_hint(graph: onnx.GraphProto, shape, original: onnx.ModelProto) -> str:
    """A note for the report when convs of ORT's graph have inputs of unknown H and W (their native
    forms could not be timed, ``_native_convs``) because the model declares dims dynamic: which
    dims, and the entry that names the sizes served; else ""."""
    from ortfuse.foundation.session_options import DIMS_KEY
    from ortfuse.ir.feeds import FeedError, declared_inputs

    hw = winograd.spatial_dims(graph, shape)
    unsized = sum(1 for n in graph.node if n.op_type == "Conv" and n.domain == winograd.NCHWC and n.input[0] not in hw)
    if not unsized:
        return ""
    try:
        names = list(dict.fromkeys(d for _, _, dims in declared_inputs(original) for d in dims[1:]
                                   if isinstance(d, str)))
    except FeedError:
        return ""
    if not names:
        return ""
    example = ",".join(f"{d}=N" for d in names[:3])
    return (f"; {unsized} blocked conv(s) of unknown size, whose native forms were not timed (the model declares "
            f"{', '.join(names[:3])} dynamic): name the sizes served in the {DIMS_KEY} entry ({example}) to time them")


def _deciding_output(index: GraphIndex) -> str:
    """Why the layout step must leave the graph to ORT: a conv, channel scale or op a region would move
    whose output decides a discontinuous op (``fusion.discontinuity``), else ""."""
    deciding = deciding_tensors(index)
    for node in index.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "Mul") or regions.may_move(node):
            tensor = next((o for o in node.output if o in deciding), None)
            if tensor is not None:
                return f"the output of {node.op_type} '{index.name_of(node)}' decides {deciding[tensor]}"
    return ""


def _prune_stray_inputs(graph, fused_graph) -> list[str]:
    """Drop graph inputs of ORT's optimized ``graph`` that the fused model fed from initializers
    (models of IR version < 4 list every initializer as an input) and that lost their initializer
    and every reader there (constant folding, a replaced Conv's weights): kept, they would become
    inputs a caller must feed. Returns the names of inputs still read without an initializer that
    the fused model's callers never fed (the plan must then step aside)."""
    fed = {i.name for i in fused_graph.input} - {t.name for t in fused_graph.initializer}
    have = {t.name for t in graph.initializer}
    read = {name for n in graph.node for name in n.input}
    keep, stray = [], []
    for i in graph.input:
        if i.name in fed or i.name in have:
            keep.append(i)
        elif i.name in read:
            keep.append(i)
            stray.append(i.name)
    del graph.input[:]
    graph.input.extend(keep)
    return stray
