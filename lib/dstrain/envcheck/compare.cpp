#include "dstrain/envcheck/compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "dstrain/core/rank_list.h"

namespace dstrain::envcheck {
namespace {

// "2.11.0: ranks 0–1, 3; 2.10.0: rank 2"
std::string groups_text(const std::vector<ValueGroup>& groups) {
  std::string out;
  for (const auto& g : groups)
    out += fmt::format("{}{}: {}", out.empty() ? "" : "; ", g.value.empty() ? "(empty)" : g.value, format_ranks(g.ranks));
  return out;
}

double leading_number(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

}  // namespace

std::vector<std::string> Report::mismatches() const {
  std::vector<std::string> out;
  for (const auto& r : rows)
    if (!r.ok) out.push_back(r.name);
  return out;
}

Report compare(const std::vector<RankFacts>& input) {
  std::vector<RankFacts> ranks = input;
  std::sort(ranks.begin(), ranks.end(), [](const RankFacts& a, const RankFacts& b) { return a.rank < b.rank; });
  Report report;
  report.world_size = static_cast<int>(ranks.size());
  std::map<int, std::string> host_of_node;
  for (const auto& r : ranks) {
    for (const auto& f : r.facts)
      if (f.name == "host" && !host_of_node.count(r.node)) host_of_node[r.node] = f.value;
    if (!host_of_node.count(r.node)) host_of_node[r.node] = "?";
  }
  report.nodes = static_cast<int>(host_of_node.size());
  for (const auto& [node, host] : host_of_node) report.hosts.push_back(host);

  // Fact names in rank 0's order, then any that only later ranks have.
  std::vector<std::string> names;
  std::set<std::string> known;
  std::map<std::string, Rule> rule_of;
  for (const auto& r : ranks)
    for (const auto& f : r.facts)
      if (known.insert(f.name).second) names.push_back(f.name), rule_of[f.name] = f.rule;

  for (const auto& name : names) {
    Row row;
    row.name = name;
    row.rule = rule_of[name];
    std::map<int, const Fact*> by_rank;
    for (const auto& r : ranks)
      for (const auto& f : r.facts)
        if (f.name == name) by_rank[r.rank] = &f;
    // Measurements and limits are only where they were taken; a missing software fact is a value.
    const bool only_present = row.rule == Rule::kNotSlow || row.rule == Rule::kLimit || row.rule == Rule::kMayDiffer;
    auto add_to_group = [&row](const std::string& value, int rank) {
      auto it = std::find_if(row.groups.begin(), row.groups.end(), [&](const ValueGroup& g) { return g.value == value; });
      if (it == row.groups.end())
        row.groups.push_back({value, {rank}});
      else
        it->ranks.push_back(rank);
    };
    for (const auto& r : ranks) {
      const auto it = by_rank.find(r.rank);
      if (it == by_rank.end() && only_present) continue;
      add_to_group(it == by_rank.end() ? "(not set)" : it->second->value, r.rank);
    }
    // A fact a rank itself marks as failed (a missing file) fails whatever its rule.
    std::vector<int> failed_ranks;
    std::string failed_why;
    for (const auto& [rank, f] : by_rank)
      if (!f->ok && row.rule != Rule::kLimit) failed_ranks.push_back(rank), failed_why = failed_why.empty() ? f->why : failed_why;
    switch (row.rule) {
      case Rule::kSame:
        row.ok = row.groups.size() <= 1;
        row.mismatch = !row.ok;
        break;
      case Rule::kMayDiffer:
        break;
      case Rule::kSameInNode: {
        std::map<int, std::set<std::string>> values_of_node;
        for (const auto& r : ranks) {
          const auto it = by_rank.find(r.rank);
          values_of_node[r.node].insert(it == by_rank.end() ? "(not set)" : it->second->value);
        }
        std::vector<std::string> bad;
        for (const auto& [node, values] : values_of_node)
          if (values.size() > 1) bad.push_back(fmt::format("node {} ({})", node, host_of_node[node]));
        row.ok = bad.empty();
        row.mismatch = !row.ok;
        if (!row.ok) {
          std::string list;
          for (const auto& b : bad) list += (list.empty() ? "" : ", ") + b;
          row.note = "differs within " + list;
        }
        break;
      }
      case Rule::kLimit: {
        std::vector<int> failing;
        std::string why;
        for (const auto& [rank, f] : by_rank)
          if (!f->ok) failing.push_back(rank), why = why.empty() ? f->why : why;
        row.ok = failing.empty();
        if (!row.ok) row.note = fmt::format("{}: {}", format_ranks(failing), why);
        break;
      }
      case Rule::kNotSlow: {
        std::vector<double> values;
        for (const auto& [rank, f] : by_rank) values.push_back(leading_number(f->value));
        if (values.empty()) break;
        std::vector<double> sorted = values;
        std::sort(sorted.begin(), sorted.end());
        const double median = sorted[sorted.size() / 2];
        std::vector<int> slow;
        double worst = 1.0;
        for (const auto& [rank, f] : by_rank) {
          const double ratio = median > 0 ? leading_number(f->value) / median : 1.0;
          if (ratio < 0.5) slow.push_back(rank), worst = std::min(worst, ratio);
        }
        row.ok = slow.empty();
        if (!row.ok) row.note = fmt::format("{} below half the median ({:.2f}x at worst)", format_ranks(slow), worst);
        // Measurements rarely repeat exactly: show each rank's, grouped only when equal.
        break;
      }
    }
    if (!failed_ranks.empty()) {
      row.ok = false;
      row.mismatch = false;  // a rank's own failure (a missing file) is the problem, whatever the others hold
      row.note = fmt::format("{}{}: {}", row.note.empty() ? "" : row.note + "; ", format_ranks(failed_ranks), failed_why);
    }
    report.rows.push_back(std::move(row));
  }
  return report;
}

namespace {

// Many different measurements (one per rank) read better as a spread than as a list.
std::string spread_text(const Row& r) {
  double lo = 1e300, hi = -1e300;
  int lo_rank = 0, hi_rank = 0;
  std::vector<double> all;
  for (const auto& g : r.groups) {
    const double v = leading_number(g.value);
    for (int rank : g.ranks) {
      all.push_back(v);
      if (v < lo) lo = v, lo_rank = rank;
      if (v > hi) hi = v, hi_rank = rank;
    }
  }
  std::sort(all.begin(), all.end());
  const std::string& first = r.groups.front().value;
  const auto unit_at = first.find(' ');
  const std::string unit = unit_at == std::string::npos ? "" : first.substr(unit_at);
  return fmt::format("median {:g}{}, min {:g} (rank {}), max {:g} (rank {}) over {} ranks", all[all.size() / 2], unit, lo, lo_rank, hi,
                     hi_rank, all.size());
}

}  // namespace

std::string render_text(const Report& report) {
  std::string hosts;
  for (size_t i = 0; i < report.hosts.size(); ++i) hosts += (i ? ", " : "") + report.hosts[i];
  std::string out = fmt::format("check-env: {} rank{} on {} node{} ({})\n", report.world_size, report.world_size == 1 ? "" : "s",
                                report.nodes, report.nodes == 1 ? "" : "s", hosts);
  size_t width = 0;
  for (const auto& r : report.rows) width = std::max(width, r.name.size());
  for (const auto& r : report.rows) {
    std::string value;
    const bool measured = r.rule == Rule::kNotSlow || r.rule == Rule::kLimit || r.rule == Rule::kMayDiffer;
    const bool numeric = !r.groups.empty() && std::strtod(r.groups[0].value.c_str(), nullptr) != 0.0;
    if (r.groups.size() == 1)
      value = r.groups[0].value;
    else if (measured && numeric && r.groups.size() > 3)
      value = spread_text(r);
    else
      value = groups_text(r.groups);
    // \u00b7: shown without a check (a host name, a bandwidth with nothing to compare it with).
    const char* mark = !r.ok ? "\u2717" : r.rule == Rule::kMayDiffer ? "\u00b7" : "\u2713";
    out += fmt::format("  {} {:<{}}  {}{}\n", mark, r.name, width, value, r.note.empty() ? "" : "  [" + r.note + "]");
  }
  std::vector<std::string> mismatched, problems;
  size_t shown = 0;
  for (const auto& r : report.rows) {
    if (!r.ok) (r.mismatch ? mismatched : problems).push_back(r.name);
    shown += r.ok && r.rule == Rule::kMayDiffer;
  }
  if (mismatched.empty() && problems.empty()) {
    out += fmt::format("consistent: {} facts agree on all {} ranks{}\n", report.rows.size() - shown, report.world_size,
                       shown ? fmt::format(" ({} more shown without a check, \u00b7)", shown) : "");
    return out;
  }
  std::string verdict;
  if (!mismatched.empty())
    verdict = fmt::format("{} mismatch{}: {}", mismatched.size(), mismatched.size() == 1 ? "" : "es", fmt::join(mismatched, ", "));
  if (!problems.empty())
    verdict += fmt::format("{}{} problem{} on some ranks: {}", verdict.empty() ? "" : "; ", problems.size(),
                           problems.size() == 1 ? "" : "s", fmt::join(problems, ", "));
  out += "not consistent: " + verdict + "\n";
  return out;
}

}  // namespace dstrain::envcheck
