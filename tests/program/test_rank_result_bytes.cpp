// A rank's share as bytes (program/layouts/rank_result_bytes.h): what real ranks
// send to rank 0 comes back field for field, and broken bytes are refused.
#include <gtest/gtest.h>

#include "program/layouts/layout.h"
#include "program/layouts/rank_result_bytes.h"

namespace bp::layouts {
namespace {

RankResult sample() {
  RankResult r;
  r.values = {{0, 3, -1.25f, 0.5f}, {2, 0, -7.0f, 1.0f}};
  r.grads.push_back({"model.layers.0.self_attn.o_proj.weight", 0, 2, 4, 3, 8, {1, 2, 3, 4, 5, 6}});
  r.grads.push_back({"lm_head.weight", 5, 1, 0, 2, 2, {-0.0f, 9.5f}});
  r.captures.push_back({"layers.0.attn_out", 8, 4, 2, {3, 1}, {bf16{1}, bf16{2}, bf16{3}, bf16{0x7fc0}}});
  return r;
}

TEST(RankResultBytes, RoundTrip) {
  const RankResult a = sample();
  const RankResult b = rank_result_from_bytes(to_bytes(a));
  ASSERT_EQ(b.values.size(), a.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    EXPECT_EQ(b.values[i].seq, a.values[i].seq);
    EXPECT_EQ(b.values[i].pos, a.values[i].pos);
    EXPECT_EQ(bits_of(b.values[i].logprob), bits_of(a.values[i].logprob));
    EXPECT_EQ(bits_of(b.values[i].entropy), bits_of(a.values[i].entropy));
  }
  ASSERT_EQ(b.grads.size(), 2u);
  EXPECT_EQ(b.grads[0].name, a.grads[0].name);
  EXPECT_EQ(b.grads[0].col0, 4);
  EXPECT_EQ(b.grads[0].width, 8);
  EXPECT_EQ(b.grads[0].data, a.grads[0].data);
  EXPECT_EQ(bits_of(b.grads[1].data[0]), bits_of(-0.0f));  // the sign of zero travels
  ASSERT_EQ(b.captures.size(), 1u);
  EXPECT_EQ(b.captures[0].rows, a.captures[0].rows);
  ASSERT_EQ(b.captures[0].data.size(), 4u);
  EXPECT_EQ(b.captures[0].data[3].bits, 0x7fc0);
}

// Negative control: the comparison above sees a changed bit. Bytes 8..23 are the
// first value (after the count): seq, pos, logprob, entropy.
TEST(RankResultBytes, AChangedBitShows) {
  Bytes b = to_bytes(sample());
  b[8 + 8] ^= std::byte{1};  // the lowest bit of the first logprob
  const RankResult r = rank_result_from_bytes(b);
  EXPECT_EQ(bits_of(r.values[0].logprob), bits_of(-1.25f) ^ 1u);
  EXPECT_EQ(r.values[0].pos, 3);
}

TEST(RankResultBytes, TruncatedOrTrailingBytesAreRefused) {
  const Bytes b = to_bytes(sample());
  for (size_t n : {size_t{0}, size_t{7}, b.size() / 2, b.size() - 1})
    EXPECT_THROW(rank_result_from_bytes(Bytes(b.begin(), b.begin() + static_cast<int64_t>(n))), std::runtime_error)
        << n;
  Bytes longer = b;
  longer.push_back(std::byte{0});
  EXPECT_THROW(rank_result_from_bytes(longer), std::runtime_error);
}

TEST(LayoutNames, NcclControlSuffixRoundTrips) {
  const auto l = parse_layout("tp2-ep1-cp1+nccl-bf16sum");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->reduction, Reduction::NcclBf16Sum);
  EXPECT_EQ(l->name(), "tp2-ep1-cp1+nccl-bf16sum");
  EXPECT_EQ(parse_layout("tp2-ep1-cp1+ring")->reduction, Reduction::Ring);
  EXPECT_FALSE(parse_layout("tp2-ep1-cp1+nccl"));
}

}  // namespace
}  // namespace bp::layouts
