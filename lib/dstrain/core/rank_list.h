#pragma once
// Rank lists for people: {0,1,2,5,7,8} -> "ranks 0–2, 5, 7–8"; {3} -> "rank 3".
#include <string>
#include <vector>

namespace dstrain {

std::string format_ranks(std::vector<int> ranks);

}  // namespace dstrain
