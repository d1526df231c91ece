// Derived tables of an ExpertPlacement, shared by the functions that build placements.
#pragma once

#include "moe/eplb.h"

namespace moe::balance {

// Sets max_replicas and log2phy from phy2log, replica_rank and logcnt (all trusted).
void fill_log2phy(ExpertPlacement& placement);

}  // namespace moe::balance
