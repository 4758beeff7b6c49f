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
"""

_LAYER = "model.layers.{i}"
_ATTN = _LAYER + ".self_attn"


def _attention_ops():
    return [
        {"module": "model.embed_tokens", "op": "embed"},
        {"module": _LAYER + ".input_layernorm", "op": "layers.{i}.input_norm"},
        {"module": _ATTN + ".q_proj", "op": "layers.{i}.q_proj"},
        {"module": _ATTN + ".k_proj", "op": "layers.{i}.k_proj"},
        {"module": _ATTN + ".v_proj", "op": "layers.{i}.v_proj"},
        {"module": _ATTN + ".q_norm", "op": "layers.{i}.q_norm"},
        {"module": _ATTN + ".k_norm", "op": "layers.{i}.k_norm"},
        {"function": "apply_rotary_pos_emb", "of": _ATTN, "op": ["layers.{i}.q_rope", "layers.{i}.k_rope"],
         "layout": "bhsd"},
        # o_proj's input is the attention output o, [N][Hq·D].
        {"module": _ATTN + ".o_proj", "op": "layers.{i}.attn", "take": "input"},
        {"module": _ATTN + ".o_proj", "op": "layers.{i}.attn_out"},
        # The second norm's input is x after the first residual add.
        {"module": _LAYER + ".post_attention_layernorm", "op": "layers.{i}.resid_attn", "take": "input"},
        {"module": _LAYER + ".post_attention_layernorm", "op": "layers.{i}.post_norm"},
    ]


def _dense_mlp_ops():
    return [
        {"module": _LAYER + ".mlp.gate_proj", "op": "layers.{i}.mlp_gate"},
        {"module": _LAYER + ".mlp.up_proj", "op": "layers.{i}.mlp_up"},
        # down_proj's input is m = silu(g)·u.
        {"module": _LAYER + ".mlp.down_proj", "op": "layers.{i}.mlp_act", "take": "input"},
    ]


def _tail_ops():
    return [
        {"module": _LAYER + ".mlp", "op": "layers.{i}.mlp_out"},
        {"module": _LAYER, "op": "layers.{i}.resid_mlp"},
        {"module": "model.norm", "op": "final_norm"},
        {"module": "lm_head", "op": "logits"},
    ]


# Hugging Face transformers' Qwen3ForCausalLM: every op bitparity captures.
HF_QWEN3 = {"name": "hf-qwen3", "ops": _attention_ops() + _dense_mlp_ops() + _tail_ops()}

# Hugging Face transformers' Qwen3MoeForCausalLM. Dense layers (mlp_only_layers, or off
# the decoder_sparse_step) have the dense MLP's ops, which a MoE layer lacks: a map entry
# whose module is absent at a layer yields nothing there. The router's logits are the
# gate's output ([batch·seq, E]); the top-k weights and each slot's weighted expert
# output are computed inside the block's forward, not by a module of their own, so
# this map does not capture router_weights and expert_out (mlp_out and the gradients
# judge the experts).
HF_QWEN3_MOE = {
    "name": "hf-qwen3-moe",
    "ops": _attention_ops() + _dense_mlp_ops()
    + [{"module": _LAYER + ".mlp.gate", "op": "layers.{i}.router_logits", "layout": "flat"}] + _tail_ops(),
}

BUILT_IN = {m["name"]: m for m in (HF_QWEN3, HF_QWEN3_MOE)}


def for_model(model):
    """The built-in map of `model`'s class (by the class name Hugging Face gives it)."""
    name = type(model).__name__
    if name == "Qwen3ForCausalLM":
        return HF_QWEN3
    if name == "Qwen3MoeForCausalLM":
        return HF_QWEN3_MOE
    raise ValueError(f"no built-in name map for {name}: pass name_map= (docs/python.md, \"Name maps\"), "
                     f"one of {sorted(BUILT_IN)} or your own")
