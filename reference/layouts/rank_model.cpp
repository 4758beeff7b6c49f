// The reference's rank program: rank_program.h over the host backend and the ref ops.
#include "reference/layouts/rank_program.h"

namespace bp::layouts {

template class RankModel<ref::HostBackend>;

}  // namespace bp::layouts
