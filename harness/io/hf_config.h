// Hugging Face config.json (Qwen3 / Qwen3-MoE) -> bp::ModelConfig.
//
// Accepted: the configs Hugging Face publishes and transformers 4.5x / 5.x writes
// (legacy "rope_theta" + "rope_scaling": null + "torch_dtype", or 5.x's
// "rope_parameters": {"rope_type": "default", "rope_theta": ...} + "dtype";
// "num_experts" or 5.x's attribute name "num_local_experts").
// Every field is in one of four groups (see hf_config.cpp for the lists):
//   required     shape- and numerics-defining; absent -> BadInput (no silent default)
//   optional     with Hugging Face's own default: head_dim (qwen3_moe: hidden/heads,
//                HF's getattr fallback; qwen3: 128, Qwen3Config's class default),
//                decoder_sparse_step (1), mlp_only_layers ([]), hidden_act (silu), ...
//   harmless     read, type-checked and ignored (architectures, dtype, token ids, ...),
//                some only with the one value bitparity implements (attention_bias false,
//                use_sliding_window false, rope_scaling null, layer_types all
//                "full_attention", attention_dropout 0, hidden_act "silu")
//   unknown      anything else: BadInput "unknown field X in config.json; bitparity
//                refuses to guess", unless allow_unknown_fields (then ignored).
// An unsupported value is always BadInput naming the field and the reason.
#pragma once
#include <string>
#include <string_view>

#include "harness/io/errors.h"
#include "reference/model/config.h"

namespace bp::io {

ModelConfig parse_hf_config(std::string_view json_text, const std::string& path, bool allow_unknown_fields = false);

// `path` is a config.json or a directory holding one.
ModelConfig load_hf_config(const std::string& path, bool allow_unknown_fields = false);

}  // namespace bp::io
