// Pairwise execution: which kernel each contraction gets, and that GEMMs run on the
// operands' memory without copies when their strides allow.
#include <gtest/gtest.h>

#include "einsum/contract.h"
#include "einsum/einsum_test_util.h"
#include "qkv/einsum.h"

namespace qkv {
namespace {

using einsum_detail::ExecTrace;
using einsum_test::all_close;

ExecTrace trace_of(const std::string& eq, const std::vector<Tensor>& ops, Tensor* out = nullptr) {
  const std::vector<Shape> shapes = einsum_detail::shapes_of(ops);
  const einsum_detail::Spec spec = einsum_detail::parse(eq, shapes);
  std::vector<einsum_detail::LabelSet> sets;
  for (size_t i = 0; i < ops.size(); ++i) sets.push_back(spec.input_set(i));
  const auto path = einsum_detail::find_path(sets, spec.output_set(), spec.sizes, EinsumOptimize::auto_, {});
  ExecTrace trace;
  Tensor r = einsum_detail::execute(spec, ops, path, &trace);
  if (out) *out = r;
  return trace;
}

std::vector<Tensor> rand_ops(const std::vector<Shape>& shapes) {
  std::vector<Tensor> ops;
  for (size_t i = 0; i < shapes.size(); ++i) ops.push_back(Tensor::randn(shapes[i], 11 + i));
  return ops;
}

TEST(EinsumContract, AttentionScoresAreOneStridedBatchedGemm) {
  const std::vector<Tensor> ops = rand_ops({{2, 3, 64, 32}, {2, 3, 48, 32}});
  Tensor out;
  const ExecTrace t = trace_of("b h i d, b h j d -> b h i j", ops, &out);
  EXPECT_EQ(t.kernels, (std::vector<std::string>{"GEMM"}));
  EXPECT_EQ(t.gemm_calls, 1);
  EXPECT_EQ(t.copies, 0);
  EXPECT_TRUE(all_close(out, einsum_reference("bhid,bhjd->bhij", ops), 1e-4, 1e-4));
}

TEST(EinsumContract, SeedEquationsRunAsGemmWithoutCopies) {
  struct Case {
    const char* eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"b h i j, b h j d -> b h i d", {{2, 3, 64, 48}, {2, 3, 48, 32}}},
      {"b i d, b j d -> b i j", {{2, 64, 32}, {2, 48, 32}}},
      {"abc,cde->abde", {{2, 64, 96}, {96, 4, 24}}},
      {"aecd,abcd->acbe", {{2, 64, 4, 24}, {2, 48, 4, 24}}},
      {"acbe,aecd->abcd", {{2, 4, 48, 64}, {2, 64, 4, 24}}},
      {"abcd,cde->abe", {{2, 48, 4, 24}, {4, 24, 96}}},
      {"abc,cd->abd", {{2, 48, 96}, {96, 16}}},
      {"ij,jk->ki", {{40, 30}, {30, 50}}},
      {"ij,kj->ik", {{40, 30}, {50, 30}}},
  };
  for (const Case& c : cases) {
    const std::vector<Tensor> ops = rand_ops(c.shapes);
    Tensor out;
    const ExecTrace t = trace_of(c.eq, ops, &out);
    EXPECT_EQ(t.kernels, (std::vector<std::string>{"GEMM"})) << c.eq;
    EXPECT_EQ(t.copies, 0) << c.eq;
    EXPECT_TRUE(all_close(out, einsum_reference(c.eq, ops), 1e-4, 1e-4)) << c.eq;
  }
}

TEST(EinsumContract, InterleavedLayoutsCopyOnlyWhatTheyMust) {
  // k labels in different orders in A and B: one operand is copied (TDOT).
  const std::vector<Tensor> ops = rand_ops({{16, 8, 12}, {12, 16, 20}});
  Tensor out;
  const ExecTrace t = trace_of("abc,cad->bd", ops, &out);
  EXPECT_EQ(t.kernels, (std::vector<std::string>{"GEMM+COPY"}));
  EXPECT_EQ(t.copies, 1);
  EXPECT_TRUE(all_close(out, einsum_reference("abc,cad->bd", ops), 1e-4, 1e-4));
  // Output order interleaving m and n: computed in GEMM order, then copied out.
  const std::vector<Tensor> ops2 = rand_ops({{8, 16, 12}, {12, 10}});
  const ExecTrace t2 = trace_of("abc,cd->adb", ops2, &out);
  EXPECT_EQ(t2.kernels, (std::vector<std::string>{"GEMM+COPY"}));
  EXPECT_TRUE(all_close(out, einsum_reference("abc,cd->adb", ops2), 1e-4, 1e-4));
}

TEST(EinsumContract, NoContractedLabelRunsDirect) {
  const std::vector<Tensor> ops = rand_ops({{64, 32}, {64, 32}});
  EXPECT_EQ(trace_of("ij,ij->ij", ops).kernels, (std::vector<std::string>{"DIRECT"}));
  EXPECT_EQ(trace_of("i,j->ij", rand_ops({{64}, {64}})).kernels, (std::vector<std::string>{"DIRECT"}));
  EXPECT_EQ(trace_of("ij,jk->ik", rand_ops({{2, 3}, {3, 2}})).kernels, (std::vector<std::string>{"DIRECT"}));
}

TEST(EinsumContract, LabelsSummedInOneOperandAreReducedFirst) {
  const std::vector<Tensor> ops = rand_ops({{16, 32, 8}, {32, 24}});
  Tensor out;
  const ExecTrace t = trace_of("ijx,jk->ik", ops, &out);
  EXPECT_EQ(t.kernels, (std::vector<std::string>{"DIRECT", "GEMM"}));
  EXPECT_TRUE(all_close(out, einsum_reference("ijx,jk->ik", ops), 1e-4, 1e-4));
}

TEST(EinsumContract, BroadcastBatchDimsUseZeroStrides) {
  // 'b' is 1 in the key: a zero batch stride, still one GEMM.
  const std::vector<Tensor> ops = rand_ops({{4, 3, 40, 16}, {1, 3, 30, 16}});
  Tensor out;
  const ExecTrace t = trace_of("bhid,bhjd->bhij", ops, &out);
  EXPECT_EQ(t.kernels, (std::vector<std::string>{"GEMM"}));
  EXPECT_EQ(t.copies, 0);
  EXPECT_TRUE(all_close(out, einsum_reference("bhid,bhjd->bhij", ops), 1e-4, 1e-4));
}

TEST(EinsumContract, Float64UsesTheSameLayoutsWithoutOneDnn) {
  std::vector<Tensor> ops = {Tensor::randn({2, 3, 20, 16}, 1, DType::f64),
                             Tensor::randn({2, 3, 24, 16}, 2, DType::f64)};
  Tensor out;
  const ExecTrace t = trace_of("bhid,bhjd->bhij", ops, &out);
  EXPECT_EQ(t.kernels, (std::vector<std::string>{"GEMM"}));
  EXPECT_TRUE(all_close(out, einsum_reference("bhid,bhjd->bhij", ops), 1e-12, 1e-12));
}

}  // namespace
}  // namespace qkv
