// The compute backend the programs run on (program/qwen3_program.h, the model;
// program/layouts/rank_program.h, one rank of a layout): where tensors live and
// which implementation of each op runs. host/backend.h is the reference's (host
// vectors, the ops of reference/ops), gpu/cuda_backend.h the GPU's
// (device memory, the CUDA twins); both programs make the same op calls in the
// same order on the same shapes whichever backend runs them.
//
// A backend provides
//   Buf<T>                 owning tensor storage: data(), size(), movable
//   Resident<T>            a read-only copy of host data in backend memory (host: a
//                          view; the host vector must outlive it)
//   zeros<T>(n)            a Buf of n +0 elements
//   unset<T>(n)            a Buf of n elements for an op that writes them all (host: +0)
//   clone(buf)             a copy
//   resident(host vector)  a Resident
//   to_host(p, n)          n elements at backend pointer p, on the host
//   take(buf)              a whole Buf on the host
//   copy(dst, src, n)      within backend memory
//   resident(span)         the same for a part of a host array
//   gather_rows / scatter_rows / copy_rows, add_f32, round_to_bf16,
//   reduce_partials        data movement and elementwise arithmetic
//   all_gather / all_to_all  collectives over a layouts::Comm (layouts/comm.h)
//   every op of BP_PROGRAM_OPS, under its reference name and arguments.
#pragma once

// The ops the model and rank programs call; each backend forwards them to its own twins.
#define BP_PROGRAM_OPS(X)                                                                                               \
  X(embedding_fwd) X(embedding_bwd) X(rmsnorm_fwd) X(rmsnorm_bwd) X(linear_fwd) X(linear_dgrad) X(linear_dgrad_acc)     \
  X(linear_wgrad) X(rope_fwd) X(rope_bwd) X(attention_fwd) X(attention_bwd) X(residual_fwd) X(sum_round)                \
  X(router_fwd) X(moe_experts_fwd) X(moe_combine_fwd) X(moe_layer_bwd) X(mlp_hidden_fwd) X(mlp_bwd) X(logprob_fwd)      \
  X(logprob_bwd) X(linear_acc) X(swiglu_bwd) X(attention_bwd_dq) X(attention_bwd_kv_partials)                           \
  X(attention_bwd_kv_combine) X(logprob_chunk_max) X(logprob_row_max) X(logprob_chunk_sums) X(logprob_target_logit)     \
  X(logprob_combine) X(logprob_chunk_states) X(logprob_merge_states) X(logprob_bwd_slice) X(router_bwd)                 \
  X(moe_experts_bwd) X(moe_combine_bwd)
