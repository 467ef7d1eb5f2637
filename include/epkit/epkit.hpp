// Umbrella header for the epkit communication library.
#pragma once

#include "epkit/all_to_all.hpp"
#include "epkit/communicator.hpp"
#include "epkit/config.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"
#include "epkit/types.hpp"
