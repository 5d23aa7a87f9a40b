// ami/ami.hpp — the whole public API.
#pragma once

#include "ami/callback.hpp"
#include "ami/client.hpp"
#include "ami/collectives.hpp"
#include "ami/config.hpp"
#include "ami/context.hpp"
#include "ami/dispatch.hpp"
#include "ami/error.hpp"
#include "ami/memory.hpp"
#include "ami/params.hpp"
#include "ami/stats.hpp"
#include "ami/status.hpp"
