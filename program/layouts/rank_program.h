// The sharded rank program (SPEC.md §7), whole: the class (rank_program_class.h)
// and its members, defined by concern. Include this file to instantiate the program
// over a backend (host/layouts.cpp, gpu/virtual_ranks.cpp, gpu/nccl/real_ranks.cpp).
#pragma once
#include "program/layouts/rank_program_class.h"
#include "program/layouts/rank_sharded_linear.h"
#include "program/layouts/rank_context_parallel.h"
#include "program/layouts/rank_expert_parallel.h"
#include "program/layouts/rank_vocab_logprob.h"
#include "program/layouts/rank_forward.h"
#include "program/layouts/rank_backward.h"
