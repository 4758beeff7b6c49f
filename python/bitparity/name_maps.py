"""Name maps: where each op bitparity captures lives in an engine's module tree.

A map is a dict (JSON-able, so it can be kept in a file):

    {"name": "hf-qwen3",
     "tokens": "batched",                                 # or "flat" (below); batched is the default
     "ops": [entry, ...],
     "grads": {"rename": [[regex, replacement], ...]}}    # optional

Each entry names one place and the op(s) it yields:

    {"module": "model.layers.{i}.self_attn.o_proj",   # module path; {i} is the layer index
     "op": "layers.{i}.attn_out",                     # bitparity's name (ops.<op> in the dump)
     "take": "output"}                                # or "input": the module's first argument

    {"function": "apply_rotary_pos_emb",               # a function the module's code calls by name
     "of": "model.layers.{i}.self_attn",              # in the Python module defining this module's class
     "op": ["layers.{i}.q_rope", "layers.{i}.k_rope"],  # one op per returned tensor
     "layout": "bhsd"}                                # [batch, heads, seq, head_dim]

"layout" says how a captured tensor's rows are laid out: "bs" (the default:
[batch, seq, ...]), "bhsd" ([batch, heads, seq, dim], heads folded into the row),
"flat" ([batch·seq, ...], as MoE routers see their input; [tokens, ...] of a flat
call, the default of a flat map) or "flat_heads" ([tokens·heads, dim], token-major:
SGLang's q/k norms). A module output that is a tuple contributes its first element,
unless "index" names another; "attr" takes an attribute of an output object first
(SGLang's LogitsProcessorOutput.next_token_logits).

An op name's {expression} is an integer expression of i, the config's integers and
world: {"module": "model.layers.{i}.input_layernorm", "index": 1, "op":
"layers.{i - 1}.resid_mlp"} takes the residual sum a fused norm returns as the op of
the layer before; where an expression is negative (layer 0) the entry yields nothing.
A module that several layers share (one rotary_emb in every layer's path) takes i
from the layer running it.

A flat map ("tokens": "flat") is of an engine whose forward takes input_ids
[tokens] and positions [tokens] (vLLM, SGLang): the caller says which sequence each
token is with cap.rows() before each call (capture.py). "rows": "sampled" marks an
op computed for some rows of a call only (the logits of the sampled rows); one that
lacks rows at write() is left out of the dump and named in bitparity.not_captured.

    "split": [size, ...]     the tensor's features cut into one op each ("op" a list);
                             a size is an integer expression of the model config's
                             integers and `world` ("num_attention_heads * head_dim // world")
    "shard": 1               under tensor parallelism this op's features are this
                             rank's slice (bitparity merge concatenates them)

and, at the top level, "not_captured": [op, ...], the ops of bitparity's graph the
map cannot take (written to the dump; bisect then leaves the other side's out), and
the gradients' rules:

    "grads": {"rename": [[regex, replacement], ...],
              "split": [{"param": regex, "into": [replacement, ...], "sizes": [...], "dim": 0,
                         "per_expert": False}],   # True: dim 0 stacks experts, {e} in "into"
              "shard": [[regex, dim], ...]}      # of the Hugging Face name, after rename/split
"""

_LAYER = "model.layers.{i}"
_ATTN = _LAYER + ".self_attn"
# A rank's share of the q and kv features (split sizes: config integers and world).
_Q_LOCAL = "num_attention_heads * head_dim // world"
_KV_LOCAL = "num_key_value_heads * head_dim // world"


def _qkv_ops(fused):
    if fused:  # one column-parallel projection, [q | k | v] of this rank's heads
        return [{"module": _ATTN + ".qkv_proj", "op": ["layers.{i}.q_proj", "layers.{i}.k_proj", "layers.{i}.v_proj"],
                 "split": [_Q_LOCAL, _KV_LOCAL, _KV_LOCAL], "shard": 1}]
    return [{"module": _ATTN + f".{p}", "op": "layers.{i}." + p, "shard": 1} for p in ("q_proj", "k_proj", "v_proj")]


def _attention_ops(fused=False):
    return [
        {"module": "model.embed_tokens", "op": "embed"},
        {"module": _LAYER + ".input_layernorm", "op": "layers.{i}.input_norm"},
        *_qkv_ops(fused),
        {"module": _ATTN + ".q_norm", "op": "layers.{i}.q_norm", "shard": 1},
        {"module": _ATTN + ".k_norm", "op": "layers.{i}.k_norm", "shard": 1},
        {"function": "apply_rotary_pos_emb", "of": _ATTN, "op": ["layers.{i}.q_rope", "layers.{i}.k_rope"],
         "layout": "bhsd", "shard": 1},
        # o_proj's input is the attention output o, [N][Hq·D].
        {"module": _ATTN + ".o_proj", "op": "layers.{i}.attn", "take": "input", "shard": 1},
        {"module": _ATTN + ".o_proj", "op": "layers.{i}.attn_out"},
        # The second norm's input is x after the first residual add.
        {"module": _LAYER + ".post_attention_layernorm", "op": "layers.{i}.resid_attn", "take": "input"},
        {"module": _LAYER + ".post_attention_layernorm", "op": "layers.{i}.post_norm"},
    ]


def _dense_mlp_ops(fused=False):
    if fused:  # one column-parallel projection, [gate | up] of this rank's slice
        return [{"module": _LAYER + ".mlp.gate_up_proj", "op": ["layers.{i}.mlp_gate", "layers.{i}.mlp_up"],
                 "split": ["intermediate_size // world"] * 2, "shard": 1},
                {"module": _LAYER + ".mlp.act_fn", "op": "layers.{i}.mlp_act", "shard": 1}]
    return [
        {"module": _LAYER + ".mlp.gate_proj", "op": "layers.{i}.mlp_gate", "shard": 1},
        {"module": _LAYER + ".mlp.up_proj", "op": "layers.{i}.mlp_up", "shard": 1},
        # down_proj's input is m = silu(g)·u.
        {"module": _LAYER + ".mlp.down_proj", "op": "layers.{i}.mlp_act", "take": "input", "shard": 1},
    ]


def _tail_ops():
    return [
        {"module": _LAYER + ".mlp", "op": "layers.{i}.mlp_out"},
        {"module": _LAYER, "op": "layers.{i}.resid_mlp"},
        {"module": "model.norm", "op": "final_norm"},
        {"module": "lm_head", "op": "logits"},
    ]


def _stacked_expert_grads(gate_up, down):
    """The split rules of a layer's stacked experts: `gate_up` [E, 2·I, H] = [gate | up] of
    each expert, `down` [E, H, I] its down projection (under TP each holds the rank's slice
    of I), into each expert's Hugging Face parameters."""
    return [{"param": rf"(.*)\.experts\.{gate_up}", "per_expert": True,
             "into": [r"\1.experts.{e}.gate_proj.weight", r"\1.experts.{e}.up_proj.weight"],
             "sizes": ["moe_intermediate_size // world"] * 2},
            {"param": rf"(.*)\.experts\.{down}", "per_expert": True,
             "into": [r"\1.experts.{e}.down_proj.weight"], "sizes": ["moe_intermediate_size // world"], "dim": 1}]


# Under tensor parallelism (capture(tp=...)): column-parallel weights hold a slice of
# their output rows, row-parallel ones of their input columns (Megatron's split, which
# vLLM and SGLang follow); the norms, embedding and head are replicated.
_GRAD_SHARDS = [[r".*\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight", 0], [r".*\.(o_proj|down_proj)\.weight", 1]]

# Hugging Face transformers' Qwen3ForCausalLM: every op bitparity captures.
HF_QWEN3 = {"name": "hf-qwen3", "ops": _attention_ops() + _dense_mlp_ops() + _tail_ops(),
            "grads": {"shard": _GRAD_SHARDS}}

# A Qwen3 whose projections are fused as in vLLM's and SGLang's parameter layout
# (self_attn.qkv_proj: [q | k | v] rows of this rank's heads; mlp.gate_up_proj:
# [gate | up]; mlp.act_fn: silu(gate)·up), on Hugging Face's [batch, seq] calls. Their
# gradients are split back into Hugging Face's parameters. Each rank holds whole kv
# heads (num_key_value_heads a multiple of the TP size).
_FUSED_GRADS = [{"param": r"(.*)\.qkv_proj\.weight",
                 "into": [r"\1.q_proj.weight", r"\1.k_proj.weight", r"\1.v_proj.weight"],
                 "sizes": [_Q_LOCAL, _KV_LOCAL, _KV_LOCAL]},
                {"param": r"(.*)\.gate_up_proj\.weight", "into": [r"\1.gate_proj.weight", r"\1.up_proj.weight"],
                 "sizes": ["intermediate_size // world"] * 2}]
FUSED_QWEN3 = {
    "name": "fused-qwen3",
    "ops": _attention_ops(fused=True) + _dense_mlp_ops(fused=True) + _tail_ops(),
    "grads": {"split": _FUSED_GRADS, "shard": _GRAD_SHARDS},
}

# A MoE layer's router: the gate's logits, [tokens, E] (flat in every engine's layout).
_ROUTER = {"module": _LAYER + ".mlp.gate", "op": "layers.{i}.router_logits", "layout": "flat"}
_MOE_NOT_CAPTURED = ["router_weights", "expert_out"]

# Hugging Face transformers' Qwen3MoeForCausalLM. Dense layers (mlp_only_layers, or off
# the decoder_sparse_step) have the dense MLP's ops, which a MoE layer lacks: a map entry
# whose module is absent at a layer yields nothing there. The router's logits are the
# gate's output ([batch·seq, E]); the top-k weights and each slot's weighted expert
# output are computed inside the block's forward, not by a module of their own, so
# this map does not capture router_weights and expert_out (mlp_out and the gradients
# judge the experts), and says so: its dumps' bitparity.not_captured lists them, and
# bisect leaves the other side's out.
HF_QWEN3_MOE = {
    "name": "hf-qwen3-moe",
    "ops": _attention_ops() + _dense_mlp_ops()
    + [_ROUTER] + _tail_ops(),
    # transformers 5 stacks a layer's experts (gate_up_proj, down_proj; 4.x: a module each).
    "grads": {"split": _stacked_expert_grads("gate_up_proj", "down_proj"), "shard": _GRAD_SHARDS},
    "not_captured": _MOE_NOT_CAPTURED,
}



def _engine_ops(qk_layout, logits):
    """vLLM's and SGLang's Qwen3 module tree on flat [tokens] calls (docs/python.md
    names the source read). Their linear layers return (out, bias) and their fused
    norms (normed, residual sum): layer i's input_layernorm(x, residual) gives layer
    i-1's resid_mlp (layer 0's, called without a residual, one tensor),
    post_attention_layernorm resid_attn, model.norm the last layer's resid_mlp. RoPE
    is one module shared by every layer, (q, k) = rotary_emb(positions, q, k) of
    [tokens, heads·dim]; attention is a module; the o_proj and down_proj outputs are
    all-reduced inside them. The logits come from a LogitsProcessor for the sampled
    rows only."""
    return [
        {"module": "model.embed_tokens", "op": "embed"},
        {"module": _LAYER + ".input_layernorm", "op": "layers.{i}.input_norm"},
        {"module": _LAYER + ".input_layernorm", "index": 1, "op": "layers.{i - 1}.resid_mlp"},
        *_qkv_ops(fused=True),
        {"module": _ATTN + ".q_norm", "op": "layers.{i}.q_norm", "layout": qk_layout, "shard": 1},
        {"module": _ATTN + ".k_norm", "op": "layers.{i}.k_norm", "layout": qk_layout, "shard": 1},
        {"module": _ATTN + ".rotary_emb", "index": 0, "op": "layers.{i}.q_rope", "shard": 1},
        {"module": _ATTN + ".rotary_emb", "index": 1, "op": "layers.{i}.k_rope", "shard": 1},
        {"module": _ATTN + ".attn", "op": "layers.{i}.attn", "shard": 1},
        {"module": _ATTN + ".o_proj", "op": "layers.{i}.attn_out"},
        {"module": _LAYER + ".post_attention_layernorm", "op": "layers.{i}.post_norm"},
        {"module": _LAYER + ".post_attention_layernorm", "index": 1, "op": "layers.{i}.resid_attn"},
        *_dense_mlp_ops(fused=True),
        {"module": _LAYER + ".mlp", "op": "layers.{i}.mlp_out"},
        {"module": "model.norm", "op": "final_norm"},
        {"module": "model.norm", "index": 1, "op": "layers.{num_hidden_layers - 1}.resid_mlp"},
        dict(logits, module="logits_processor", op="logits", rows="sampled"),
    ]


_EXPERT_GRADS = _stacked_expert_grads("w13_weight", "w2_weight")  # FusedMoE's
# The engines' embedding and LM head are vocab-parallel: a rank holds a slice of the rows.
_ENGINE_SHARDS = _GRAD_SHARDS + [[r"model\.embed_tokens\.weight", 0], [r"lm_head\.weight", 0]]


def _engine_map(name, qk_layout, logits, moe):
    """A flat-token engine's map: the MoE one adds the router (gate, a ReplicatedLinear:
    its logits [tokens, E]); FusedMoE computes the top-k weights and each slot's expert
    output inside one kernel, so router_weights and expert_out are not captured, and the
    block all-reduces the experts' partial sums, so mlp_out is whole under TP."""
    ops = _engine_ops(qk_layout, logits)
    if moe:
        ops.append(_ROUTER)
    m = {"name": name, "tokens": "flat", "ops": ops,
         "grads": {"split": _FUSED_GRADS + (_EXPERT_GRADS if moe else []), "shard": _ENGINE_SHARDS}}
    if moe:
        m["not_captured"] = _MOE_NOT_CAPTURED
    return m


# vLLM: q/k norms on a [tokens, heads, dim] view; compute_logits() runs the
# LogitsProcessor, which returns the logits tensor, outside the model's forward.
VLLM_QWEN3 = _engine_map("vllm-qwen3", "flat", {}, moe=False)
VLLM_QWEN3_MOE = _engine_map("vllm-qwen3-moe", "flat", {}, moe=True)
# SGLang: q/k norms on a [tokens·heads, dim] view; the forward ends in the
# LogitsProcessor, whose LogitsProcessorOutput holds next_token_logits.
SGLANG_QWEN3 = _engine_map("sglang-qwen3", "flat_heads", {"attr": "next_token_logits"}, moe=False)
SGLANG_QWEN3_MOE = _engine_map("sglang-qwen3-moe", "flat_heads", {"attr": "next_token_logits"}, moe=True)

BUILT_IN = {m["name"]: m for m in (HF_QWEN3, HF_QWEN3_MOE, FUSED_QWEN3, VLLM_QWEN3, VLLM_QWEN3_MOE, SGLANG_QWEN3,
                                   SGLANG_QWEN3_MOE)}

# Hugging Face's, vLLM's and SGLang's classes share their names: the package defining
# the class tells them apart.
_BY_CLASS = {("Qwen3ForCausalLM", "vllm"): VLLM_QWEN3, ("Qwen3MoeForCausalLM", "vllm"): VLLM_QWEN3_MOE,
             ("Qwen3ForCausalLM", "sglang"): SGLANG_QWEN3, ("Qwen3MoeForCausalLM", "sglang"): SGLANG_QWEN3_MOE,
             ("Qwen3ForCausalLM", None): HF_QWEN3, ("Qwen3MoeForCausalLM", None): HF_QWEN3_MOE}


def for_model(model):
    """The built-in map of `model`'s class: by its name, and by its package for vLLM's
    and SGLang's (vllm.model_executor.models.qwen3, sglang.srt.models.qwen3); any
    other package's class of that name is taken for Hugging Face's."""
    cls = type(model)
    package = cls.__module__.split(".")[0]
    found = _BY_CLASS.get((cls.__name__, package if package in ("vllm", "sglang") else None))
    if found is None:
        raise ValueError(f"no built-in name map for {cls.__name__}: pass name_map= (docs/python.md, \"Name maps\"), "
                         f"one of {sorted(BUILT_IN)} or your own")
    return found
