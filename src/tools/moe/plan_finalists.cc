#include "tools/moe/plan_finalists.h"

#include <limits>

namespace moe::cli {

std::vector<size_t> plan_finalists(const std::vector<double>& medians_us, double margin) {
  double best = std::numeric_limits<double>::infinity();
  for (const double us : medians_us) {
    if (us > 0 && us < best) best = us;
  }
  std::vector<size_t> finalists;
  for (size_t i = 0; i < medians_us.size(); ++i) {
    if (medians_us[i] > 0 && medians_us[i] <= best * (1.0 + margin)) finalists.push_back(i);
  }
  if (finalists.size() < 2) finalists.clear();
  return finalists;
}

}  // namespace moe::cli
