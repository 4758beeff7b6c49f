// The sharded rank program (SPEC.md §7): what one rank of a layout computes,
// forward on every path and backward, talking to the other ranks only through
// comm.h. Built from the reference ops; the same program over GPU kernels and
// NCCL is the later implementation of the same interfaces.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "reference/layouts/comm.h"
#include "reference/layouts/layout.h"
#include "reference/layouts/sharding.h"
#include "reference/layouts/token_split.h"
#include "reference/model/qwen3.h"
#include "reference/ops/moe_experts.h"

namespace bp::layouts {

// One rank's share of the results; the runner puts the shares together.
struct RankResult {
  struct Value {
    int seq, pos;  // logprob of token pos+1 given 0..pos
    float logprob, entropy;
  };
  std::vector<Value> values;  // ranks with t == 0: their tokens that have a target
  struct GradBlock {          // rows × cols of a [*][width] parameter gradient at (row0, col0)
    std::string name;
    int64_t row0, rows, col0, cols, width;
    std::vector<float> data;
  };
  std::vector<GradBlock> grads;
  struct CaptureBlock {  // rows (canonical) × cols of a [tokens][width] capture at col0
    std::string name;
    int64_t width, col0, cols;
    std::vector<int64_t> rows;
    std::vector<bf16> data;
  };
  std::vector<CaptureBlock> captures;  // in execution order
};

class RankModel {
 public:
  RankModel(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout, int rank,
            RankComms& comms);
  ~RankModel();

  RankResult forward(const std::vector<std::vector<int32_t>>& seqs, const ref::Schedule& sched,
                     const ref::ForwardOptions& opt);
  RankResult backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed, float temperature);

 private:
  using Buf = std::vector<bf16>;
  using FBuf = std::vector<float>;
  struct Dims;
  struct Tokens;
  struct Run;
  struct LayerSaved;
  struct Saved;
  struct Routing {
    Buf logits, weights;
    std::vector<int> ids;
  };
  struct Block {  // where a rank's gradient sits in the parameter
    enum Kind { Whole, RowSlice, ColumnSlice } kind;
    int64_t rows, cols;  // of this rank's block
  };

  Run start(const std::vector<std::vector<int32_t>>& seqs, const ref::ForwardOptions& opt) const;
  Tokens my_tokens(const Run& run, const std::vector<ref::SchedulePiece>& pieces) const;
  void step(Run& run, const std::vector<ref::SchedulePiece>& pieces, Saved* saved);
  void capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols, int64_t col0,
               int64_t width) const;

  const bf16* weight(const std::string& name) const;
  const bf16* row_slice(const std::string& name, int rows, int cols) const;
  Buf row_parallel(const bf16* x, const std::string& name, int T, int k_local, int n) const;
  FBuf column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k, int n_local) const;
  void share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                const std::vector<ref::SchedulePiece>& pieces, Buf& kp, Buf& vp, std::map<int, int>& kv_begin) const;
  Buf dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  ref::ExpertWeights expert_weights(int64_t li, int e_begin, int e_end, std::vector<const bf16*> (&ptr)[3]) const;
  Routing route(int64_t li, const Buf& a2, int T) const;
  Buf moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  void logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const;

  void emit(Run& run, const std::string& name, FBuf g, Block block) const;
  FBuf split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x, int k) const;
  FBuf split_norm_dw(const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd, const Buf& dy,
                     int heads, int n) const;
  Buf norm_bwd(Run& run, const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd,
               const Buf& dy, int heads, int n, bool heads_sliced) const;
  Buf dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2, const Buf& dout) const;
  Buf moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li, const Buf& a2, const Buf& dout) const;
  void attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s, const std::map<int, int>& kv_begin,
                        const Buf& dO, Buf& dk, Buf& dv) const;
  void backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const;

  const ModelConfig& cfg_;
  const Weights& w_;
  Knobs kn_;
  Layout layout_;
  GridPos at_;
  RankComms& comms_;
  std::unique_ptr<const Dims> d_;
  std::vector<bf16> rope_cos_, rope_sin_;
  std::map<std::string, std::vector<bf16>> column_shards_;  // row-parallel weights' K slices
};

}  // namespace bp::layouts
