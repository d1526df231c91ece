// The whole public API of moe-engine.
#pragma once

#include "moe/align.h"
#include "moe/backend.h"
#include "moe/config.h"
#include "moe/dtype.h"
#include "moe/eplb.h"
#include "moe/error.h"
#include "moe/experts.h"
#include "moe/layer.h"
#include "moe/load_recorder.h"
#include "moe/params.h"
#include "moe/placement.h"
#include "moe/routing.h"
#include "moe/tensor.h"
