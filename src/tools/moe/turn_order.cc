#include "tools/moe/turn_order.h"

#include <algorithm>

namespace moe::cli {

size_t turn_order_cycle(size_t plans) { return plans % 2 == 0 || plans == 1 ? plans : 2 * plans; }

std::vector<size_t> turn_order(size_t plans, size_t round) {
  std::vector<size_t> order;
  if (plans == 0) return order;
  // First row 0, 1, n-1, 2, n-2, ...: for even n its consecutive differences take every nonzero
  // value mod n once, so shifting it by the round's number gives each ordered pair of neighbours
  // once per n rows.
  const size_t row = round % turn_order_cycle(plans);
  size_t low = 1, high = plans - 1;
  order.push_back(0);
  for (bool take_low = true; order.size() < plans; take_low = !take_low) {
    order.push_back(take_low ? low++ : high--);
  }
  for (size_t& plan : order) plan = (plan + row) % plans;
  // For odd n the differences repeat some values and miss others; reversed rows negate them, and
  // the two halves of the cycle together take every value twice.
  if (row >= plans) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace moe::cli
