#pragma once

namespace finegemm::testing {

// Runs the stage-ring probe of cluster_ring_probe.cu (mode 0: one CTA; 1: a 2-CTA cluster releasing stages in the
// peer as the GEMM does; 2: the same with a cluster-scope release on the remote arrival; 3: one CTA, every consumer
// thread arriving on the empty barrier instead of lane 0 after __syncwarp) and returns how many slot
// reads saw another value than the loader wrote for that lap (0 when the protocol holds).
int run_cluster_ring_probe(int mode);

}  // namespace finegemm::testing
