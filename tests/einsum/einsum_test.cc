// einsum semantics: numpy's test_einsum equations and the seed equations, against
// the naive float64 reference (einsum_reference) and against known values.
#include <gtest/gtest.h>

#include <cmath>

#include "einsum/einsum_test_util.h"
#include "qkv/einsum.h"

namespace qkv {
namespace {

using einsum_test::all_close;

struct Case {
  std::string equation;
  std::vector<Shape> shapes;
};

// Checks einsum against the reference for several optimizers, in f64 and f32.
void check(const Case& c) {
  SCOPED_TRACE(c.equation);
  for (DType dtype : {DType::f64, DType::f32}) {
    std::vector<Tensor> ops;
    for (size_t i = 0; i < c.shapes.size(); ++i) ops.push_back(Tensor::randn(c.shapes[i], 7 + i, dtype));
    const Tensor want = einsum_reference(c.equation, ops);
    for (EinsumOptimize opt : {EinsumOptimize::none, EinsumOptimize::greedy, EinsumOptimize::optimal,
                               EinsumOptimize::dp, EinsumOptimize::auto_}) {
      EinsumOptions options;
      options.optimize = opt;
      const Tensor got = einsum(c.equation, ops, options);
      const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
      EXPECT_TRUE(all_close(got, want, tol, tol)) << einsum_optimize_name(opt) << " " << dtype_name(dtype);
    }
  }
}

TEST(Einsum, SeedEquations) {
  // Seed 000 (spaced) and seed 001 (Keras MultiHeadAttention), plus the EinsumDense forms.
  // A table, one case per line:
  // clang-format off
  const std::vector<Case> cases = {
      {"b i k, b j k -> b i j", {{2, 5, 8}, {2, 7, 8}}},
      {"b i d, b j d -> b i j", {{3, 4, 6}, {3, 5, 6}}},
      {"b i j, b j d -> b i d", {{3, 4, 5}, {3, 5, 6}}},
      {"b h i d, b h j d -> b h i j", {{2, 3, 9, 16}, {2, 3, 11, 16}}},
      {"b h i j, b h j d -> b h i d", {{2, 3, 9, 11}, {2, 3, 11, 16}}},
      {"abc,cde->abde", {{2, 2, 3}, {3, 2, 4}}},
      {"aecd,abcd->acbe", {{2, 2, 2, 4}, {2, 2, 2, 4}}},
      {"acbe,aecd->abcd", {{2, 2, 2, 2}, {2, 2, 2, 4}}},
      {"abcd,cde->abe", {{2, 2, 2, 4}, {2, 4, 3}}},
      {"abc,cd->abd", {{2, 2, 3}, {3, 1}}},
      {"abcd,def->abcef", {{2, 3, 4, 5}, {5, 2, 3}}},
      {"abcde,def->abcf", {{2, 3, 4, 2, 3}, {2, 3, 5}}},
      {"afgde,abcde->adbcfg", {{2, 3, 2, 4, 5}, {2, 3, 2, 4, 5}}},
      {"abc,cde->abde", {{2, 32, 48}, {48, 4, 12}}},
      {"aecd,abcd->acbe", {{2, 32, 4, 16}, {2, 24, 4, 16}}},
      {"acbe,aecd->abcd", {{2, 4, 24, 32}, {2, 32, 4, 16}}},
      {"abcd,cde->abe", {{2, 24, 4, 16}, {4, 16, 48}}},
  };
  // clang-format on
  for (const Case& c : cases) check(c);
}

TEST(Einsum, NumpySumsTracesDiagonalsAndScalars) {
  // A table, one case per line:
  // clang-format off
  const std::vector<Case> cases = {
      {"i->", {{7}}},          {"i,i->", {{7}, {7}}},          {"i,i->i", {{7}, {7}}},
      {",i->i", {{}, {7}}},    {"i,->i", {{7}, {}}},           {",i->", {{}, {7}}},
      {"i,->", {{7}, {}}},     {"i,i,i->", {{5}, {5}, {5}}},   {"i,i,i,i->", {{5}, {5}, {5}, {5}}},
      {",,->", {{}, {}, {}}},  {"ii", {{4, 4}}},               {"ii->", {{4, 4}}},
      {"ijij->", {{3, 4, 3, 4}}}, {"iij->j", {{3, 3, 5}}},     {"ij->", {{3, 4}}},
      {"ij->j", {{3, 4}}},     {"ij->i", {{3, 4}}},            {"ijk->kji", {{2, 3, 4}}},
      {"ii->i", {{4, 4}}},     {"...ii->...i", {{2, 3, 3}}},   {"ii...->...i", {{3, 3, 2}}},
      {"bbcdc->d", {{1, 1, 3, 1, 3}}}, {"ijklm,ijn,ijn->", {{5, 4, 4, 2, 3}, {5, 4, 6}, {5, 4, 6}}},
      {"x,yx,zx->xzy", {{2}, {2, 2}, {4, 2}}}, {"i,j", {{1}, {1}}}, {"i,j", {{3}, {4}}},
      {"ij,ij->ij", {{3, 4}, {3, 4}}}, {"ij,ji->", {{3, 4}, {4, 3}}}, {"cl, cpx->lpx", {{2, 3}, {2, 3, 7}}},
      {"cl, cpxy->lpxy", {{3, 3}, {3, 3, 4, 4}}}, {"...,...", {{2, 3}, {3}}}, {"ijk,j->ijk", {{2, 3, 4}, {3}}},
  };
  // clang-format on
  for (const Case& c : cases) check(c);
}

TEST(Einsum, NumpyBroadcasting) {
  // A table, one case per line:
  // clang-format off
  const std::vector<Case> cases = {
      {"ij...,j...->i...", {{1, 2}, {2, 2, 1}}},
      {"...i,...i", {{3}, {3}}},
      {"ij...,j...->ij...", {{2, 3, 4}, {3}}},
      {"ij...,...j->ij...", {{2, 3, 4}, {3}}},
      {"ij...,j->ij...", {{2, 3, 4}, {3}}},
      {"ik...,k...->i...", {{4, 3}, {3, 2}}},
      {"ik...,...kj->i...j", {{4, 3}, {3, 2}}},
      {"...k,kj", {{4, 3}, {3, 2}}},
      {"ik,k...->i...", {{4, 3}, {3, 2}}},
      {"ijkl,k", {{2, 3, 4, 5}, {4}}},
      {"...kl,k", {{2, 3, 4, 5}, {4}}},
      {"...kl,k...", {{2, 3, 4, 5}, {4}}},
      {"...lmn,lmno->...o", {{1, 1, 1, 6, 5, 4}, {6, 5, 4, 3}}},
      {"...lmn,...lmno->...o", {{1, 1, 1, 6, 5, 4}, {6, 5, 4, 3}}},
      {"...ft,mf->...mt", {{2, 3, 5}, {4, 3}}},
      {"ijk,kl,jl", {{1, 5, 4}, {4, 6}, {5, 6}}},
      {"ijk,kl,jl,i->i", {{1, 5, 4}, {4, 6}, {5, 6}, {10}}},
      {"abjk,kl,jl", {{1, 1, 5, 4}, {4, 6}, {5, 6}}},
      {"abjk,kl,jl,ab->ab", {{1, 1, 5, 4}, {4, 6}, {5, 6}, {7, 7}}},
      {"obk,ijk->ioj", {{2, 4, 8}, {2, 4, 8}}},
      {"ijp,ipq,ikq->ijk", {{3, 1, 1}, {3, 1, 3}, {1, 3, 3}}},
      {"jhcabhijaci,dfijejgh->fgje", {{1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1}, {3, 1, 3, 1, 1, 1, 1, 2}}},
      {"baegffahgc,hdggeff->dhg", {{2, 1, 4, 1, 1, 1, 1, 2, 1, 1}, {1, 1, 1, 1, 4, 1, 1}}},
      {"cehgbaifff,fhhdegih->cdghbi", {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 1, 1, 2, 4, 1, 1, 1}}},
      {"gah,cdbcghefg->ef", {{2, 3, 1}, {1, 3, 1, 1, 1, 2, 1, 4, 1}}},
      {"cacc,bcb->", {{1, 1, 1, 1}, {1, 4, 1}}},
      {"i...j,j...k->...ik", {{2, 5, 3}, {3, 4, 1, 2}}},
  };
  // clang-format on
  for (const Case& c : cases) check(c);
}

TEST(Einsum, NumpyOptimizeCompareCases) {
  // A table, one case per line:
  // clang-format off
  const std::vector<std::string> equations = {
      "a,ab,abc->abc", "a,b,ab->ab", "ea,fb,gc,hd,abcd->efgh", "ea,fb,abcd,gc,hd->efgh",
      "abcd,ea,fb,gc,hd->efgh", "acdf,jbje,gihb,hfac,gfac,gifabc,hfac", "cd,bdhe,aidb,hgca,gc,hgibcd,hgac",
      "abhe,hidj,jgba,hiab,gab", "bde,cdh,agdb,hica,ibd,hgicd,hiac", "chd,bde,agbc,hiad,hgc,hgi,hiad",
      "chd,bde,agbc,hiad,bdi,cgh,agdb", "bdhe,acad,hiab,agac,hibd", "ab,ab,c->", "ab,ab,c->c",
      "ab,ab,cd,cd->", "ab,ab,cd,cd->ac", "ab,ab,cd,cd->cd", "ab,ab,cd,cd,ef,ef->", "ab,cd,ef->abcdef",
      "ab,cd,ef->acdf", "ab,cd,de->abcde", "ab,cd,de->be", "ab,bcd,cd->abcd", "ab,bcd,cd->abd",
      "eb,cb,fb->cef", "dd,fb,be,cdb->cef", "bca,cdb,dbf,afc->", "dcc,fce,ea,dbf->ab", "fdf,cdd,ccd,afe->ae",
      "abcd,ad", "ed,fcd,ff,bcf->be", "baa,dcf,af,cde->be", "bd,db,eac->ace", "fff,fae,bef,def->abd",
      "efc,dbc,acf,fd->abe", "ba,ac,da->bcd", "ab,ab", "ab,ba", "abc,abc", "abc,bac", "abc,cba",
      "aab,fa,df,ecc->bde", "ecb,fef,bad,ed->ac", "bcf,bbb,fbf,fc->", "bb,ff,be->e", "bcb,bb,fc,fff->",
      "fbb,dfd,fc,fc->", "afd,ba,cc,dc->bf", "adb,bc,fa,cfc->d", "bbd,bda,fc,db->acf", "dba,ead,cad->bce",
      "aef,fbc,dca->bde",
  };
  // clang-format on
  for (const std::string& eq : equations) check({eq, einsum_test::shapes_for(eq, einsum_test::numpy_size)});
}

TEST(Einsum, ImplicitOutputIsSortedUppercaseFirstWithBroadcastDimsFirst) {
  const Tensor a = Tensor::randn({2, 3, 4}, 1, DType::f64);
  EXPECT_EQ(einsum("bAa", {a}).shape(), (Shape{3, 4, 2}));  // A, a, b
  EXPECT_EQ(einsum("...ba", {a}).shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(einsum("ij,jk", {Tensor::ones({2, 3}), Tensor::ones({3, 5})}).shape(), (Shape{2, 5}));
  EXPECT_EQ(einsum("ii", {Tensor::ones({3, 3})}).dim(), 0);  // trace: 'i' appears twice
}

TEST(Einsum, SpacesAreIgnored) {
  const Tensor a = Tensor::ones({1, 1});
  for (const char* eq : {"...a->...a", " ... a -> ... a ", "...a ->...a", "... a->... a"}) {
    EXPECT_EQ(einsum(eq, {a}).shape(), (Shape{1, 1})) << eq;
  }
}

TEST(Einsum, SingleOperandWithoutSummationIsAView) {
  const Tensor a = Tensor::arange(6, DType::f64).reshape({2, 3});
  for (const char* eq : {"...", "ij", "ji"}) {
    const Tensor v = einsum(eq, {a});
    EXPECT_TRUE(v.shares_storage(a)) << eq;
  }
  EXPECT_EQ(einsum("ji", {a}).shape(), (Shape{3, 2}));
  EXPECT_EQ(einsum("ji", {a}).item({2, 1}), 5.0);
}

TEST(Einsum, DiagonalIsAView) {
  const Tensor a = Tensor::arange(9, DType::i64).reshape({3, 3});
  const Tensor d = einsum("ii->i", {a});
  EXPECT_TRUE(d.shares_storage(a));
  EXPECT_EQ(d.dtype(), DType::i64);
  EXPECT_EQ(d.to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 8}));
}

TEST(Einsum, DiagonalWithEllipsisIsAView) {
  const Tensor a = Tensor::arange(27, DType::f32).reshape({3, 3, 3});
  const Tensor b = einsum("...ii->...i", {a});
  EXPECT_TRUE(b.shares_storage(a));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{0, 4, 8, 9, 13, 17, 18, 22, 26}));
  const Tensor c = einsum("ii...->...i", {a});  // [x[i, i] for x in a.transpose(2, 0, 1)]
  EXPECT_TRUE(c.shares_storage(a));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 12, 24, 1, 13, 25, 2, 14, 26}));
  const Tensor e = einsum("i...i->...i", {a});
  EXPECT_TRUE(e.shares_storage(a));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{0, 10, 20, 3, 13, 23, 6, 16, 26}));
}

TEST(Einsum, KnownValues) {
  const Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3}), b = Tensor::from_vector<double>({2, 3, 4}, {3});
  EXPECT_EQ(einsum("...i,...i", {a, b}).item(), 20.0);
  const Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  const Tensor y = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor z = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const std::vector<double> want = {1, 3, 3, 9, 5, 15, 7, 21, 8, 16, 16, 32, 24, 48, 32, 64};
  EXPECT_EQ(einsum("x,yx,zx->xzy", {x, y, z}).to_vector<double>(), want);
  const Tensor ones_a = Tensor::ones({1, 2}, DType::f64), ones_b = Tensor::ones({2, 2, 1}, DType::f64);
  EXPECT_EQ(einsum("ij...,j...->i...", {ones_a, ones_b}).to_vector<double>(), (std::vector<double>{2, 2}));
}

TEST(Einsum, ResultTypePromotion) {
  const Tensor f32 = Tensor::ones({3}), f64 = Tensor::ones({3}, DType::f64);
  const Tensor f16 = Tensor::ones({3}, DType::f16), bf16 = Tensor::ones({3}, DType::bf16);
  const Tensor i32 = Tensor::ones({3}, DType::i32), b8 = Tensor::ones({3}, DType::b8);
  EXPECT_EQ(einsum("i,i", {f32, f32}).dtype(), DType::f32);
  EXPECT_EQ(einsum("i,i", {f32, f64}).dtype(), DType::f64);
  EXPECT_EQ(einsum("i,i", {f16, f16}).dtype(), DType::f16);
  EXPECT_EQ(einsum("i,i", {bf16, bf16}).dtype(), DType::bf16);
  EXPECT_EQ(einsum("i,i", {f16, f32}).dtype(), DType::f32);
  EXPECT_EQ(einsum("i,i", {i32, f32}).dtype(), promote_types(DType::i32, DType::f32));
  EXPECT_EQ(einsum("i,i", {i32, i32}).dtype(), DType::i32);
  EXPECT_EQ(einsum("i,i", {i32, i32}).item(), 3.0);
  EXPECT_EQ(einsum("i,i", {b8, b8}).dtype(), DType::b8);
  EXPECT_EQ(einsum("i,i", {f16, f16}).item(), 3.0);
}

// numpy's integer sums wrap modulo 2^8 / 2^32 (the values below are numpy 2.4.6's), and so do
// einsum's since a831bb2; the reference saturated (127 for -128), and the einsum fuzzer's
// committed seed 'ab,bc,ad' (64 x 2 int8 ones: 128) stopped on it at once.
TEST(Einsum, IntegerOverflowWrapsInEinsumAndTheReference) {
  struct Overflow {
    std::string equation;
    std::vector<Tensor> ops;
    std::vector<double> numpy;
  };
  const std::vector<Overflow> cases = {
      {"i,i", {Tensor::full({30}, 100, DType::i8), Tensor::full({30}, 100, DType::i8)}, {-32}},
      {"i,i->", {Tensor::full({3}, 50000, DType::i32), Tensor::full({3}, 50000, DType::i32)}, {-1089934592}},
      {"ab,bc,ad",
       {Tensor::ones({64, 2}, DType::i8), Tensor::ones({2, 1}, DType::i8), Tensor::ones({64, 4}, DType::i8)},
       {-128, -128, -128, -128}},
      {"i,i->", {Tensor::full({2}, -128, DType::i8), Tensor::ones({2}, DType::i8)}, {0}},
  };
  for (const Overflow& c : cases) {
    SCOPED_TRACE(c.equation);
    EXPECT_EQ(einsum_reference(c.equation, c.ops).to_vector<double>(), c.numpy);
    for (EinsumOptimize opt : {EinsumOptimize::none, EinsumOptimize::greedy, EinsumOptimize::optimal}) {
      EinsumOptions options;
      options.optimize = opt;
      EXPECT_EQ(einsum(c.equation, c.ops, options).to_vector<double>(), c.numpy) << einsum_optimize_name(opt);
    }
  }
}

TEST(Einsum, HalfInputsAreComputedInFloat32) {
  // Every element is 64 * h^2 with h = 0.1 in f16 (0.0999755859375): in float64,
  // 0.63968753814697265625 exactly. An f32 accumulation rounds it once to f16 (half
  // an ulp, 2^-12 in [0.5, 1)); a running f16 sum ends 6 ulps low.
  const Tensor h = Tensor::full({64, 64}, 0.1, DType::f16);
  ASSERT_EQ(h.item({0, 0}), 0.0999755859375);
  const double exact = 64.0 * 0.0999755859375 * 0.0999755859375;
  const Tensor got = einsum("ij,jk->ik", {h, h});
  EXPECT_EQ(got.dtype(), DType::f16);
  for (double g : got.to_vector<double>()) ASSERT_LE(std::fabs(g - exact), 0x1.0p-12) << g << " vs " << exact;
}

TEST(Einsum, NonContiguousOperands) {
  const Tensor a = Tensor::randn({6, 8, 5}, 3).permute({2, 0, 1});  // [5, 6, 8]
  const Tensor b = Tensor::randn({8, 12}, 4).slice(1, 0, 12, 2);    // [8, 6] with stride 2
  const Tensor want = einsum_reference("bij,jk->bik", std::vector<Tensor>{a, b});
  EXPECT_TRUE(all_close(einsum("bij,jk->bik", {a, b}), want, 1e-5, 1e-5));
  const Tensor e = Tensor::randn({5, 1, 8}, 5).expand({5, 6, 8});  // zero strides
  EXPECT_TRUE(
      all_close(einsum("bij,bij->b", {e, a}), einsum_reference("bij,bij->b", std::vector<Tensor>{e, a}), 1e-5, 1e-5));
}

TEST(Einsum, ZeroSizedDims) {
  const Tensor a = Tensor::zeros({0, 3}), b = Tensor::ones({3, 4});
  EXPECT_EQ(einsum("ij,jk->ik", {a, b}).shape(), (Shape{0, 4}));
  const Tensor s = einsum("ij,jk->k", {Tensor::zeros({2, 0}), Tensor::zeros({0, 4})});
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
}

TEST(Einsum, ExplicitPathsIncludingSingleOperandSteps) {
  const std::vector<Tensor> ops = {Tensor::randn({4, 2, 3}, 1, DType::f64), Tensor::randn({4, 5, 5}, 2, DType::f64)};
  EinsumOptions options;
  options.path = std::vector<std::vector<int>>{{1}, {0, 1}};
  EXPECT_TRUE(all_close(einsum("cab,cdd->ab", ops, options), einsum_reference("cab,cdd->ab", ops), 1e-12, 1e-12));
  const std::vector<Tensor> four = einsum_test::operands_for(
      "dcc,fce,ea,dbf->ab", einsum_test::shapes_for("dcc,fce,ea,dbf->ab", einsum_test::numpy_size));
  options.path = std::vector<std::vector<int>>{{0, 2}, {0, 2}, {0, 1}};
  EXPECT_TRUE(all_close(einsum("dcc,fce,ea,dbf->ab", four, options), einsum_reference("dcc,fce,ea,dbf->ab", four),
                        1e-12, 1e-12));
}

TEST(Einsum, EmptyExplicitPathForOneOperand) {
  EinsumOptions options;
  options.path = std::vector<std::vector<int>>{};
  const std::vector<Tensor> one = {Tensor::ones({3, 4}, DType::f64)};
  EXPECT_EQ(einsum("ij->i", one, options).to_vector<double>(), (std::vector<double>{4, 4, 4}));
}

TEST(Einsum, FiftyTwoLabels) {
  std::string lhs;
  for (char c = 'A'; c <= 'Z'; ++c) lhs += c;
  for (char c = 'a'; c <= 'z'; ++c) lhs += c;
  const Tensor x = Tensor::ones(Shape(52, 1), DType::f64);
  const Tensor r = einsum(lhs + "->" + lhs.substr(0, 26), {x});
  EXPECT_EQ(r.dim(), 26);
  EXPECT_EQ(einsum(lhs, {x}).dim(), 52);
}

}  // namespace
}  // namespace qkv
