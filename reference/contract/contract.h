// Contracts: named, versioned definitions of the bits of every op (SPEC.md §1).
// The knobs are plain data so kernels take them by value; the name and the knob
// hash stamp every report and golden digest.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reference/numerics/dot.h"
#include "reference/numerics/reduce.h"

namespace bp {

// The softmax exponential (SPEC.md §1.1): v1's natural-base math::exp of scaled
// scores, or v2's base-2 exp2_poly with the scale folded into one fma per element.
enum class SoftmaxExp : uint8_t { kExp, kExp2Poly };
// Log-softmax's schedule: v1's chunk sums against the row's maximum, or v2's chunk
// states against their own maxima merged by the pairwise tree.
enum class LogSoftmax : uint8_t { kTwoPass, kOnePass };

struct Knobs {
  DotModel dot;           // how every bf16·bf16 -> fp32 dot is accumulated
  LaneShape row_reduce;   // shape of full-row fp32 sums (RMSNorm, softmax sums)
  int attn_kv_block;      // keys per online-softmax block
  int attn_kv_split;      // keys per flash-decoding split (a multiple of the block)
  int tp_tree_width;      // fixed chunks of a shardable reduction, combined by pairwise_tree
  int grad_token_chunk;   // tokens per weight-gradient chunk
  // Knobs added after v1; at their v1 values they stay out of the canonical text, so
  // the earlier contracts' hashes hold.
  SoftmaxExp softmax_exp = SoftmaxExp::kExp;      // v2
  LogSoftmax log_softmax = LogSoftmax::kTwoPass;  // v2
  bool sign_clamp = false;  // v3: logprob = min(logprob, +0), entropy = max(entropy, +0)
};

struct Contract {
  std::string name;  // e.g. "bf16-sm90tc-v1": a new version for any change of bits
  Knobs knobs;

  // Canonical text of the knobs (sorted keys, no spaces): what the hash covers.
  std::string canonical_knobs() const;
  // First 16 hex digits of SHA-256(canonical_knobs()).
  std::string knob_hash() const;
};

std::string_view dot_model_name(DotModel m);
std::optional<DotModel> parse_dot_model(std::string_view name);

std::string_view softmax_exp_name(SoftmaxExp e);  // "exp", "exp2_poly"
std::string_view log_softmax_name(LogSoftmax l);  // "two-pass", "one-pass"

// The named contracts, in a stable order: v1 and v2 (frozen), then v3 (SPEC.md §1.2-§1.4).
const std::vector<Contract>& contracts();
// The current version's pair (v3): what a sweep runs when it names no contract.
const std::vector<std::string>& default_contract_names();
// nullptr if there is no contract of that name.
const Contract* find_contract(std::string_view name);

// Empty if the knobs are consistent, otherwise a message naming the bad knob.
std::string validate(const Knobs& k);

}  // namespace bp
