// The whole public API.
#pragma once
#include "finegemm/backend.hpp"
#include "finegemm/ep.hpp"
#include "finegemm/error.hpp"
#include "finegemm/linear.hpp"
#include "finegemm/moe.hpp"
#include "finegemm/quantize.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"
