"""Name maps: where each op bitparity captures lives in an engine's module tree.

A map is a dict (JSON-able, so it can be kept in a file):

    {"name": "hf-qwen3",
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
[batch, seq, ...]), "bhsd" ([batch, heads, seq, dim], heads folded into the row)
or "flat" ([batch·seq, ...], as MoE routers see their input). A module output that
is a tuple contributes its first element, unless "index" names another.

    "split": [size, ...]     the tensor's features cut into one op each ("op" a list);
                             a size is an integer expression of the model config's
                             integers and `world` ("num_attention_heads * head_dim // world")
    "shard": 1               under tensor parallelism this op's features are this
                             rank's slice (bitparity merge concatenates them)

and, at the top level, "not_captured": [op, ...], the ops of bitparity's graph the
map cannot take (written to the dump; bisect then leaves the other side's out), and
the gradients' rules:

    "grads": {"rename": [[regex, replacement], ...],
              "split": [{"param": regex, "into": [replacement, ...], "sizes": [...], "dim": 0}],
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
FUSED_QWEN3 = {
    "name": "fused-qwen3",
    "ops": _attention_ops(fused=True) + _dense_mlp_ops(fused=True) + _tail_ops(),
    "grads": {"split": [{"param": r"(.*)\.qkv_proj\.weight", "into": [r"\1.q_proj.weight", r"\1.k_proj.weight",
                                                                       r"\1.v_proj.weight"],
                         "sizes": [_Q_LOCAL, _KV_LOCAL, _KV_LOCAL]},
                        {"param": r"(.*)\.gate_up_proj\.weight", "into": [r"\1.gate_proj.weight", r"\1.up_proj.weight"],
                         "sizes": ["intermediate_size // world"] * 2}],
              "shard": _GRAD_SHARDS},
}

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
    + [{"module": _LAYER + ".mlp.gate", "op": "layers.{i}.router_logits", "layout": "flat"}] + _tail_ops(),
    "grads": {"shard": _GRAD_SHARDS},
    "not_captured": ["router_weights", "expert_out"],
}

BUILT_IN = {m["name"]: m for m in (HF_QWEN3, HF_QWEN3_MOE, FUSED_QWEN3)}


def for_model(model):
    """The built-in map of `model`'s class (by the class name Hugging Face gives it)."""
    name = type(model).__name__
    if name == "Qwen3ForCausalLM":
        return HF_QWEN3
    if name == "Qwen3MoeForCausalLM":
        return HF_QWEN3_MOE
    raise ValueError(f"no built-in name map for {name}: pass name_map= (docs/python.md, \"Name maps\"), "
                     f"one of {sorted(BUILT_IN)} or your own")
