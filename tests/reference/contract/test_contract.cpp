#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "reference/common/sha256.h"
#include "reference/contract/contract.h"

namespace bp {
namespace {

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk);
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Contract, NamedContractsExistAndValidate) {
  ASSERT_NE(find_contract("bf16-sm90tc-v1"), nullptr);
  ASSERT_NE(find_contract("bf16-fmaseq-v1"), nullptr);
  ASSERT_NE(find_contract("bf16-sm90tc-v2"), nullptr);
  ASSERT_NE(find_contract("bf16-fmaseq-v2"), nullptr);
  ASSERT_NE(find_contract("bf16-sm90tc-v3"), nullptr);
  ASSERT_NE(find_contract("bf16-fmaseq-v3"), nullptr);
  EXPECT_EQ(find_contract("bf16-sm90tc-v4"), nullptr);
  EXPECT_EQ(contracts().size(), 6u);
  EXPECT_EQ(find_contract("bf16-sm90tc-v1")->knobs.dot, DotModel::Sm90Tc);
  EXPECT_EQ(find_contract("bf16-fmaseq-v1")->knobs.dot, DotModel::FmaSeq);
  EXPECT_EQ(find_contract("bf16-sm90tc-v2")->knobs.dot, DotModel::Sm90Tc);
  EXPECT_EQ(find_contract("bf16-fmaseq-v2")->knobs.dot, DotModel::FmaSeq);
  EXPECT_EQ(find_contract("bf16-sm90tc-v3")->knobs.dot, DotModel::Sm90Tc);
  EXPECT_EQ(find_contract("bf16-fmaseq-v3")->knobs.dot, DotModel::FmaSeq);
  for (const Contract& c : contracts()) EXPECT_EQ(validate(c.knobs), "") << c.name;
}

// A sweep that names no contract runs the v3 pair, and both are selectable.
TEST(Contract, DefaultsAreTheV3Pair) {
  EXPECT_EQ(default_contract_names(), (std::vector<std::string>{"bf16-sm90tc-v3", "bf16-fmaseq-v3"}));
  for (const std::string& name : default_contract_names()) EXPECT_NE(find_contract(name), nullptr) << name;
}

// The hashes are pinned: a change of any knob must be a new contract version
// (v1 and v2 frozen, v3 released).
TEST(Contract, KnobHashesArePinned) {
  // Each generation's knobs enter the text in key order (SPEC.md §1.1).
  const std::pair<const char*, const char*> texts[] = {
      {"bf16-sm90tc-v1",
       "{\"attn_kv_block\":64,\"attn_kv_split\":512,\"dot\":\"sm90-tc\",\"grad_token_chunk\":128,"
       "\"row_reduce_lanes\":256,\"row_reduce_vec\":8,\"tp_tree_width\":8}"},
      {"bf16-sm90tc-v2",
       "{\"attn_kv_block\":64,\"attn_kv_split\":512,\"dot\":\"sm90-tc\",\"grad_token_chunk\":128,"
       "\"log_softmax\":\"one-pass\",\"row_reduce_lanes\":256,\"row_reduce_vec\":8,\"softmax_exp\":\"exp2_poly\","
       "\"tp_tree_width\":8}"},
      {"bf16-sm90tc-v3",
       "{\"attn_kv_block\":64,\"attn_kv_split\":512,\"dot\":\"sm90-tc\",\"grad_token_chunk\":512,"
       "\"log_softmax\":\"one-pass\",\"row_reduce_lanes\":256,\"row_reduce_vec\":8,\"sign_clamp\":true,"
       "\"softmax_exp\":\"exp2_poly\",\"tp_tree_width\":8}"}};
  for (const auto& [name, text] : texts) EXPECT_EQ(find_contract(name)->canonical_knobs(), text) << name;
  EXPECT_EQ(find_contract("bf16-sm90tc-v1")->knob_hash(), "43a602a29cdd98f8");
  EXPECT_EQ(find_contract("bf16-fmaseq-v1")->knob_hash(), "833bb4d7d43b7bb1");
  EXPECT_EQ(find_contract("bf16-sm90tc-v2")->knob_hash(), "4af40b8561fc78fd");
  EXPECT_EQ(find_contract("bf16-fmaseq-v2")->knob_hash(), "aee5a46e84d4f39c");
  EXPECT_EQ(find_contract("bf16-sm90tc-v3")->knob_hash(), "1e4d52369050db29");
  EXPECT_EQ(find_contract("bf16-fmaseq-v3")->knob_hash(), "c558b9429a00e2a9");
}

TEST(Contract, EveryKnobChangesTheHash) {
  const Contract base = *find_contract("bf16-sm90tc-v1");
  std::set<std::string> seen{base.knob_hash()};
  auto variant = [&](auto mutate) {
    Contract c = base;
    mutate(c.knobs);
    return c.knob_hash();
  };
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.dot = DotModel::FmaSeq; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.row_reduce.lanes = 128; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.row_reduce.vec = 4; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.attn_kv_block = 128; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.attn_kv_split = 1024; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.tp_tree_width = 16; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.grad_token_chunk = 64; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.softmax_exp = SoftmaxExp::kExp2Poly; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.log_softmax = LogSoftmax::kOnePass; })).second);
  EXPECT_TRUE(seen.insert(variant([](Knobs& k) { k.sign_clamp = true; })).second);
}

// Each generation's knobs are its predecessor's (same dot model) but the ones it
// changes: with those set back, the canonical texts are equal.
template <class SetBack>
void expect_predecessor_but(int version, SetBack set_back) {
  for (const char* dot : {"sm90tc", "fmaseq"}) {
    const std::string stem = std::string("bf16-") + dot + "-v";
    const Contract& newer = *find_contract(stem + std::to_string(version));
    const Contract& older = *find_contract(stem + std::to_string(version - 1));
    Knobs k = newer.knobs;
    set_back(k, older.knobs);
    EXPECT_EQ((Contract{"", k}.canonical_knobs()), older.canonical_knobs()) << newer.name;
  }
}

// v2's knobs are v1's but the softmax's two (SPEC.md §1.3).
TEST(Contract, V2IsV1WithTheGpuNativeSoftmax) {
  expect_predecessor_but(2, [](Knobs& k, const Knobs& v1) {
    k.softmax_exp = v1.softmax_exp;
    k.log_softmax = v1.log_softmax;
  });
}

// v3's knobs are v2's but the gradient chunk (512) and the sign clamp (SPEC.md §1.4).
TEST(Contract, V3IsV2WithLongerChunksAndTheSignClamp) {
  expect_predecessor_but(3, [](Knobs& k, const Knobs& v2) {
    EXPECT_EQ(k.grad_token_chunk, 512);
    k.grad_token_chunk = v2.grad_token_chunk;
    k.sign_clamp = v2.sign_clamp;
  });
}

TEST(Contract, ValidateNamesTheBadKnob) {
  Knobs k = find_contract("bf16-sm90tc-v1")->knobs;
  k.attn_kv_split = 100;
  EXPECT_NE(validate(k).find("attn_kv_split"), std::string::npos);
  k = find_contract("bf16-sm90tc-v1")->knobs;
  k.row_reduce.lanes = 48;
  EXPECT_NE(validate(k).find("row_reduce_lanes"), std::string::npos);
  k = find_contract("bf16-sm90tc-v1")->knobs;
  k.tp_tree_width = 6;
  EXPECT_NE(validate(k).find("tp_tree_width"), std::string::npos);
}

TEST(DotModelNames, RoundTrip) {
  for (DotModel m : {DotModel::FmaSeq, DotModel::Sm90Tc}) EXPECT_EQ(parse_dot_model(dot_model_name(m)), m);
  EXPECT_FALSE(parse_dot_model("sm80-tc").has_value());
}

}  // namespace
}  // namespace bp
