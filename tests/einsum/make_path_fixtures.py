"""Writes tests/einsum/path_fixtures.json: opt_einsum's contraction paths and costs.

For the path cases of numpy's test_einsum.py and opt_einsum's test suite (plus
seeded random equations), records what opt_einsum.contract_path returns for each
optimizer: the path, its FLOP cost (opt_cost) and the naive cost. The C++ test
EinsumPlan.* checks that qkv's planner finds paths of the same cost.

Run:  .venv/bin/python tests/einsum/make_path_fixtures.py   (needs opt_einsum, numpy)
"""
import functools
import itertools
import json
import pathlib
import sys

import opt_einsum as oe
from opt_einsum.testing import build_shapes, rand_equation

HERE = pathlib.Path(__file__).resolve().parent
METHODS = ["optimal", "greedy", "branch-all", "branch-2", "branch-1", "dp", "auto"]

# opt_einsum/tests/test_contract.py `tests` (sizes: opt_einsum.testing defaults).
OE_CONTRACT = [
    "a,->a", "ab,->ab", ",ab,->ab", ",,->", "a,ab,abc->abc", "a,b,ab->ab",
    "ea,fb,gc,hd,abcd->efgh", "ea,fb,abcd,gc,hd->efgh", "abcd,ea,fb,gc,hd->efgh",
    "acdf,jbje,gihb,hfac,gfac,gifabc,hfac", "cd,bdhe,aidb,hgca,gc,hgibcd,hgac",
    "abhe,hidj,jgba,hiab,gab", "bde,cdh,agdb,hica,ibd,hgicd,hiac", "chd,bde,agbc,hiad,hgc,hgi,hiad",
    "chd,bde,agbc,hiad,bdi,cgh,agdb", "bdhe,acad,hiab,agac,hibd",
    "ab,ab,c->", "ab,ab,c->c", "ab,ab,cd,cd->", "ab,ab,cd,cd->ac", "ab,ab,cd,cd->cd", "ab,ab,cd,cd,ef,ef->",
    "ab,cd,ef->abcdef", "ab,cd,ef->acdf", "ab,cd,de->abcde", "ab,cd,de->be", "ab,bcd,cd->abcd", "ab,bcd,cd->abd",
    "eb,cb,fb->cef", "dd,fb,be,cdb->cef", "bca,cdb,dbf,afc->", "dcc,fce,ea,dbf->ab", "fdf,cdd,ccd,afe->ae",
    "abcd,ad", "ed,fcd,ff,bcf->be", "baa,dcf,af,cde->be", "bd,db,eac->ace", "fff,fae,bef,def->abd",
    "efc,dbc,acf,fd->abe", "ab,ab", "ab,ba", "abc,abc", "abc,bac", "abc,cba", "ab,bc", "ab,cb", "ba,bc",
    "ba,cb", "abcd,cd", "abcd,ab", "abcd,cdef", "abcd,cdef->feba", "abcd,efdc", "aab,bc->ac", "ab,bcc->ac",
    "aab,bcc->ac", "baa,bcc->ac", "aab,ccb->ac", "aab,fa,df,ecc->bde", "ecb,fef,bad,ed->ac", "bcf,bbb,fbf,fc->",
    "bb,ff,be->e", "bcb,bb,fc,fff->", "fbb,dfd,fc,fc->", "afd,ba,cc,dc->bf", "adb,bc,fa,cfc->d",
    "bbd,bda,fc,db->acf", "dba,ead,cad->bce", "aef,fbc,dca->bde",
]
# numpy/_core/tests/test_einsum.py TestEinsumPath (sizes: its global_size_dict).
NP_SIZES = dict(zip("abcdefghij", [2, 3, 4, 5, 4, 3, 2, 6, 5, 4]))
NP_PATHS = ["a,b,c->abc", "acdf,jbje,gihb,hfac", "acdf,jbje,gihb,hfac,gfac,gifabc,hfac",
            "chd,bde,agbc,hiad,bdi,cgh,agdb", "eb,cb,fb->cef", "dd,fb,be,cdb->cef", "bca,cdb,dbf,afc->",
            "dcc,fce,ea,dbf->ab", "cab,cdd->ab", "ab,bc,cd,de->ae"]


def exhaustive_min_cost(eq, shapes):
    """The least contract_path cost over every sequence of pairwise contractions
    (memoized on the multiset of remaining index sets), with opt_einsum's helpers."""
    inputs, output, _ = oe.parser.parse_einsum_input((eq, *shapes), shapes=True)
    terms = inputs.split(",")
    if len(terms) <= 2:
        return None
    size = {}
    for term, shape in zip(terms, shapes):
        for c, d in zip(term, shape):
            size[c] = d if size.get(c, 1) == 1 else size[c]
    out = frozenset(output)

    @functools.lru_cache(maxsize=None)
    def best(state):
        if len(state) == 1:
            return 0
        least = None
        for i, j in itertools.combinations(range(len(state)), 2):
            rest = [s for k, s in enumerate(state) if k not in (i, j)]
            keep = out.union(*rest)
            contract = state[i] | state[j]
            result = contract & keep
            cost = oe.helpers.flop_count(contract, bool(contract - result), 2, size)
            total = cost + best(tuple(sorted(rest + [result], key=sorted)))
            least = total if least is None else min(least, total)
        return least

    return int(best(tuple(sorted((frozenset(t) for t in terms), key=sorted))))


def record(eq, shapes, method, memory_limit=None):
    path, info = oe.contract_path(eq, *shapes, shapes=True, optimize=method, memory_limit=memory_limit)
    exhaustive = exhaustive_min_cost(eq, shapes) if method == "optimal" and memory_limit is None else None
    return {"exhaustive_min_cost": exhaustive, "equation": eq, "shapes": [list(s) for s in shapes], "method": method, "memory_limit": memory_limit,
            "path": [list(p) for p in path], "opt_cost": int(info.opt_cost), "naive_cost": int(info.naive_cost),
            "largest_intermediate": int(info.largest_intermediate)}


def main():
    cases = []
    for eq in OE_CONTRACT:
        for m in METHODS:
            cases.append(record(eq, build_shapes(eq), m))
    for eq in NP_PATHS:
        shapes = [tuple(NP_SIZES[c] for c in term) for term in eq.split("->")[0].split(",")]
        for m in METHODS:
            cases.append(record(eq, shapes, m))
        for m in ["optimal", "greedy", "branch-2"]:  # memory limits, as numpy's test_memory_contraints
            cases.append(record(eq, shapes, m, memory_limit=1))
            cases.append(record(eq, shapes, m, memory_limit=64))
    # opt_einsum's test_paths path_edge_tests and seeded random equations.
    for seed in range(40):
        n = 3 + seed % 5
        eq, shapes = rand_equation(n, 3, n_out=seed % 3, d_min=2, d_max=6, seed=seed, global_dim=seed % 4 == 0)
        for m in METHODS:
            cases.append(record(eq, shapes, m))
    for seed in range(40, 50):
        eq, shapes = rand_equation(10, 3, n_out=2, d_min=2, d_max=5, seed=seed)
        for m in ["greedy", "branch-1", "branch-2", "dp", "auto"]:
            cases.append(record(eq, shapes, m))
    out = HERE / "path_fixtures.json"
    out.write_text(json.dumps({"generator": "tests/einsum/make_path_fixtures.py", "opt_einsum": oe.__version__,
                               "cases": cases}, indent=0) + "\n")
    print(f"wrote {len(cases)} cases to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
