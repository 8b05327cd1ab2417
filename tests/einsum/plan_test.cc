// The planner against opt_einsum: path costs recorded by make_path_fixtures.py
// (opt_einsum.contract_path on numpy's and opt_einsum's path test cases).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "einsum/plan.h"
#include "qkv/einsum.h"

namespace qkv {
namespace {

struct Fixture {
  std::string equation, method;
  std::vector<Shape> shapes;
  std::optional<int64_t> memory_limit;
  std::vector<std::vector<int>> path;
  double opt_cost = 0, naive_cost = 0, largest = 0;
  std::optional<double> exhaustive;  // least cost over every pairwise path (optimal, no limit, > 2 operands)
};

std::vector<Fixture> load_fixtures() {
  std::ifstream in(std::string(QKV_SOURCE_DIR) + "/tests/einsum/path_fixtures.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Fixture> out;
  for (const auto& c : j.at("cases")) {
    Fixture f;
    f.equation = c.at("equation");
    f.method = c.at("method");
    for (const auto& s : c.at("shapes")) f.shapes.push_back(s.get<Shape>());
    if (!c.at("memory_limit").is_null()) f.memory_limit = c.at("memory_limit").get<int64_t>();
    f.path = c.at("path").get<std::vector<std::vector<int>>>();
    f.opt_cost = c.at("opt_cost").get<double>();
    f.naive_cost = c.at("naive_cost").get<double>();
    f.largest = c.at("largest_intermediate").get<double>();
    if (!c.at("exhaustive_min_cost").is_null()) f.exhaustive = c.at("exhaustive_min_cost").get<double>();
    out.push_back(std::move(f));
  }
  return out;
}

EinsumPath ours(const Fixture& f, const std::string& method) {
  EinsumOptions options;
  options.optimize = einsum_optimize_from_name(method);
  options.memory_limit = f.memory_limit;
  return einsum_path(f.equation, std::span<const Shape>(f.shapes), options);
}

TEST(EinsumPlan, FixturesCoverNumpyAndOptEinsumCases) { EXPECT_GE(load_fixtures().size(), 900u); }

TEST(EinsumPlan, OptimalMatchesOptEinsumCost) {
  // Equal to opt_einsum's optimal cost, except where opt_einsum's optimal is itself
  // above the exhaustive minimum (its search memoizes pair costs across different
  // sets of remaining operands); there ours equals the exhaustive minimum.
  int equal = 0, better = 0;
  for (const Fixture& f : load_fixtures()) {
    if (f.method != "optimal") continue;
    const EinsumPath p = ours(f, "optimal");
    if (f.exhaustive && *f.exhaustive < f.opt_cost) {
      EXPECT_EQ(p.optimized_flops, *f.exhaustive) << f.equation;
      ++better;
    } else {
      EXPECT_EQ(p.optimized_flops, f.opt_cost) << f.equation << " limit " << f.memory_limit.value_or(-1);
      ++equal;
    }
  }
  EXPECT_GT(equal, 100);
  EXPECT_LE(better, 8);
}

TEST(EinsumPlan, OptimalIsTheExhaustiveMinimum) {
  for (const Fixture& f : load_fixtures()) {
    if (f.method == "optimal" && f.exhaustive) {
      EXPECT_EQ(ours(f, "optimal").optimized_flops, *f.exhaustive) << f.equation;
    }
  }
}

TEST(EinsumPlan, DpIsNeverWorseThanOptEinsumDp) {
  // Like opt_einsum's dp, single-operand sums go first; unlike it, every split (outer
  // products too) is searched exactly, so the cost is at most opt_einsum's dp.
  int equal = 0, total = 0;
  for (const Fixture& f : load_fixtures()) {
    if (f.method != "dp") continue;
    const EinsumPath p = ours(f, "dp");
    EXPECT_LE(p.optimized_flops, f.opt_cost) << f.equation;
    equal += p.optimized_flops == f.opt_cost;
    ++total;
  }
  EXPECT_GT(equal, total * 3 / 4);
}

TEST(EinsumPlan, GreedyMatchesOptEinsumCost) {
  for (const Fixture& f : load_fixtures()) {
    if (f.method != "greedy") continue;
    EXPECT_EQ(ours(f, f.method).optimized_flops, f.opt_cost) << f.equation << " limit " << f.memory_limit.value_or(-1);
  }
}

TEST(EinsumPlan, BranchAndAutoAreNeverWorseThanOptEinsum) {
  // Ports of opt_einsum's branch-and-bound; they differ only where opt_einsum's search
  // reuses a memoized pair result computed for other remaining operands (ours is lower).
  int equal = 0, total = 0;
  for (const Fixture& f : load_fixtures()) {
    if (f.method.rfind("branch", 0) != 0 && f.method != "auto") continue;
    const EinsumPath p = ours(f, f.method);
    EXPECT_LE(p.optimized_flops, f.opt_cost) << f.method << " " << f.equation;
    equal += p.optimized_flops == f.opt_cost;
    ++total;
  }
  EXPECT_GE(equal, total - 12);
}

TEST(EinsumPlan, NaiveCostAndLargestIntermediateMatchOptEinsum) {
  for (const Fixture& f : load_fixtures()) {
    if (f.method != "optimal") continue;
    const EinsumPath p = ours(f, "optimal");
    EXPECT_EQ(p.naive_flops, f.naive_cost) << f.equation;
    if (p.path == f.path) {
      EXPECT_EQ(p.largest_intermediate, f.largest) << f.equation;
    }
  }
}

TEST(EinsumPlan, OptEinsumEdgePathsAreReproduced) {
  // opt_einsum tests/test_paths.py path_edge_tests (dims from its testing defaults).
  struct Edge {
    const char* method;
    const char* eq;
    std::vector<std::vector<int>> path;
  };
  const std::vector<Edge> edges = {
      {"greedy", "eb,cb,fb->cef", {{0, 2}, {0, 1}}},
      {"branch-all", "eb,cb,fb->cef", {{0, 2}, {0, 1}}},
      {"optimal", "eb,cb,fb->cef", {{0, 2}, {0, 1}}},
      {"greedy", "dd,fb,be,cdb->cef", {{0, 3}, {0, 1}, {0, 1}}},
      {"optimal", "dd,fb,be,cdb->cef", {{0, 3}, {0, 1}, {0, 1}}},
      {"greedy", "bca,cdb,dbf,afc->", {{1, 2}, {0, 2}, {0, 1}}},
      {"optimal", "bca,cdb,dbf,afc->", {{1, 2}, {0, 2}, {0, 1}}},
      {"greedy", "dcc,fce,ea,dbf->ab", {{1, 2}, {0, 1}, {0, 1}}},
      {"branch-all", "dcc,fce,ea,dbf->ab", {{1, 2}, {0, 2}, {0, 1}}},
      {"optimal", "dcc,fce,ea,dbf->ab", {{1, 2}, {0, 2}, {0, 1}}},
  };
  const int dims[] = {2, 3, 4, 5, 4, 3, 2, 6};  // a..h
  for (const Edge& e : edges) {
    std::vector<Shape> shapes(1);
    for (const char* c = e.eq; *c && *c != '-'; ++c) {
      if (*c == ',')
        shapes.emplace_back();
      else
        shapes.back().push_back(dims[*c - 'a']);
    }
    EinsumOptions options;
    options.optimize = einsum_optimize_from_name(e.method);
    EXPECT_EQ(einsum_path(e.eq, std::span<const Shape>(shapes), options).path, e.path) << e.method << " " << e.eq;
  }
}

TEST(EinsumPlan, MemoryLimitZeroGivesOneStep) {
  // numpy's test_memory_contraints.
  const std::vector<Shape> shapes = {{2}, {3}, {4}};
  EinsumOptions options;
  options.memory_limit = 1;
  for (auto opt : {EinsumOptimize::greedy, EinsumOptimize::optimal}) {
    options.optimize = opt;
    EXPECT_EQ(einsum_path("a,b,c->abc", std::span<const Shape>(shapes), options).path,
              (std::vector<std::vector<int>>{{0, 1, 2}}));
  }
}

TEST(EinsumPlan, AutoFollowsOptEinsumRules) {
  EinsumOptions options;  // default: auto
  const std::vector<Shape> two = {{2, 3}, {3, 4}};
  EXPECT_EQ(einsum_path("ij,jk->ik", std::span<const Shape>(two), options).path,
            (std::vector<std::vector<int>>{{0, 1}}));
  options.optimize = EinsumOptimize::none;
  const std::vector<Shape> four = {{4, 3, 3}, {3, 3, 4}, {4, 2}, {4, 3, 3}};
  EXPECT_EQ(einsum_path("dcc,fce,ea,dbf->ab", std::span<const Shape>(four), options).path,
            (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
}

TEST(EinsumPlan, ReportLooksLikeNumpys) {
  const std::vector<Shape> shapes = {{2, 3}, {3, 4}};
  const EinsumPath p = einsum_path("ij,jk", std::span<const Shape>(shapes));
  EXPECT_NE(p.report.find("  Complete contraction:  ij,jk->ik\n"), std::string::npos) << p.report;
  EXPECT_NE(p.report.find("         Naive scaling:  3\n"), std::string::npos) << p.report;
  EXPECT_NE(p.report.find("      Naive FLOP count:  4.800e+01\n"), std::string::npos) << p.report;
  EXPECT_NE(p.report.find("  Largest intermediate:  8.000e+00 elements\n"), std::string::npos) << p.report;
  EXPECT_NE(p.report.find("jk,ij->ik"), std::string::npos) << p.report;
  EXPECT_EQ(p.steps.size(), 1u);
}

TEST(EinsumPlan, SsaToLinear) {
  using einsum_detail::ssa_to_linear;
  EXPECT_EQ(ssa_to_linear({{0, 3}, {2, 4}, {1, 5}}), (std::vector<std::vector<int>>{{0, 3}, {1, 2}, {0, 1}}));
}

}  // namespace
}  // namespace qkv
