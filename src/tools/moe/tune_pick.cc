#include "tools/moe/tune_pick.h"

namespace moe::cli {

bool table_keeps_default(double default_over_best, double margin) {
  return default_over_best <= 1.0 + margin;
}

}  // namespace moe::cli
