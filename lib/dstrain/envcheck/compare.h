#pragma once
// Compares the facts of every rank by each fact's rule and renders the verdict: a table with
// ✓/✗ per fact, and for each mismatch the groups of ranks holding each value, e.g.
// "nccl  2.21.5: ranks 0–7; 2.19.3: ranks 8–15". JSON (docs/check-env.schema.json) for machines.
#include <string>
#include <vector>

#include "dstrain/envcheck/facts.h"

namespace dstrain::envcheck {

struct RankFacts {
  int rank = 0;
  int node = 0;  // the node index (ranks with the same node index share a machine)
  Facts facts;
};

struct ValueGroup {
  std::string value;
  std::vector<int> ranks;
};

struct Row {
  std::string name;
  Rule rule = Rule::kSame;
  bool ok = true;
  std::vector<ValueGroup> groups;  // in order of each value's first rank
  std::string note;                // what is wrong (limits, slow ranks, nodes that disagree)
  // Why a row fails: its ranks disagree (a mismatch), or a rank fails a limit or a check of its
  // own (a missing file, a slow GEMM): a problem, which no other rank's value would fix.
  bool mismatch = false;
};

struct Report {
  int world_size = 0;
  int nodes = 0;
  std::vector<std::string> hosts;  // one per node, in node order
  std::vector<Row> rows;
  // check_ranks, on every rank: this rank's facts that fail by themselves (a missing data file, a
  // limit), "name: value (why)" each, so that every rank can say what is wrong with it.
  std::vector<std::string> own_failures;
  std::vector<std::string> mismatches() const;  // names of the rows that are not ok (JSON: "mismatches")
  bool consistent() const { return mismatches().empty(); }
};

// Every rank's facts (any order); rows follow rank 0's fact order, then facts only others have.
Report compare(const std::vector<RankFacts>& ranks);

std::string render_text(const Report& report);
std::string render_json(const Report& report);  // compact, one object

}  // namespace dstrain::envcheck
