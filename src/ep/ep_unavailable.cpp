// finegemm/ep.hpp in a build without expert parallelism (no CUDA backend, or no NCCL found at configure time):
// every entry point throws a Runtime Error that says so. The real implementation is src/cuda/runtime/ep.cu.
#include <string>

#include "finegemm/ep.hpp"
#include "finegemm/error.hpp"

namespace finegemm {

struct EpGroupState {};

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw Error(ErrorKind::Runtime,
              std::string(what) + ": this finegemm was built without expert parallelism (it needs the CUDA backend "
                                  "and NCCL: configure with -DFINEGEMM_CUDA=ON -DFINEGEMM_NCCL=ON, NCCL_ROOT if needed)");
}
}  // namespace

bool ep_available() { return false; }
EpUniqueId ep_unique_id() { unavailable("ep_unique_id"); }

EpGroup::EpGroup() = default;
EpGroup::EpGroup(std::unique_ptr<EpGroupState> state) : state_(std::move(state)) {}
EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;
EpGroupState& EpGroup::state() const { unavailable("EpGroup"); }
int EpGroup::rank() const { unavailable("EpGroup::rank"); }
int EpGroup::world() const { unavailable("EpGroup::world"); }
int EpGroup::device() const { unavailable("EpGroup::device"); }
EpGroup EpGroup::init(int, int, const EpUniqueId&, int) { unavailable("EpGroup::init"); }
std::vector<EpGroup> EpGroup::init_all(const std::vector<int>&) { unavailable("EpGroup::init_all"); }

void validate_moe_ep(const MoeArgs&, int, int, int, int, const EpMoeOptions&) { unavailable("validate_moe_ep"); }
void moe_experts_ep(const MoeArgs&, int, EpGroup&, const EpMoeOptions&, const RunOptions&) {
  unavailable("moe_experts_ep");
}

}  // namespace finegemm
