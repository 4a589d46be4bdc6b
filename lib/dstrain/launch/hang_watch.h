#pragma once
// The launcher's view of its workers' heartbeats (see core/progress.h), and the verdict on a
// hang: a rank whose heartbeat went stale (the process is frozen or gone), or a collective that
// has waited longer than its timeout. The report names the stuck rank and where every rank is,
// e.g. "rank 3 (host-a) stuck in backward of step 12: no heartbeat for 10 s; ranks 0–2 waiting
// in reduce_scatter #1742 (step 12) for 12 s". Pure logic on the launcher's own clock, so clock
// skew between nodes does not matter.
#include <optional>
#include <string>
#include <vector>

#include "dstrain/core/progress.h"

namespace dstrain::launch {

class HangWatch {
 public:
  HangWatch(int world_size, double heartbeat_timeout_s, double collective_timeout_s);

  // The latest raw heartbeat value of `rank` (nullopt: none yet), seen at launcher time now_s.
  void observe(int rank, const std::optional<std::string>& value, double now_s);
  // The same as another node's launcher saw it: its heartbeat last changed `age_s` ago (on that
  // launcher's clock, so skew does not matter).
  void observe_aged(int rank, const std::string& value, double age_s, double now_s);
  // Seconds since `rank`'s heartbeat last changed (nullopt: none yet).
  std::optional<double> age(int rank, double now_s) const;

  struct Verdict {
    bool hung = false;
    std::vector<int> stuck;  // the ranks to blame (empty when every rank waits in the same op)
    std::string host;        // of the first stuck rank
    std::string report;
  };
  Verdict check(double now_s) const;
  // Where every rank is, grouped: "ranks 0–2: reduce_scatter #1742 (step 12) for 12 s; rank 3: ...".
  std::string positions(double now_s) const;

 private:
  struct Rank {
    bool seen = false;
    progress::Beat beat;
    double last_change_s = 0;
  };
  double stale_for(const Rank& r, double now_s) const { return now_s - r.last_change_s; }
  double in_phase_for(const Rank& r, double now_s) const { return r.beat.where.phase_s + stale_for(r, now_s); }
  std::vector<Rank> ranks_;
  double heartbeat_timeout_s_, collective_timeout_s_;
};

}  // namespace dstrain::launch
