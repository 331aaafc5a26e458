// A rare branch opened as CEK_RARE_PATH() opens one (pmevent: a PMTRIG in SASS) that loads
// again after using the first load: the walk leaves it out, so 1 round and one LDG.E, where
// reading the branch as ordinary code would give 2 rounds and two loads.
extern "C" __global__ void rare_branch(const float* __restrict__ x, float* out, float big) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    if (v > big) {
        asm volatile("pmevent 0;");
        v = 2.0f * x[i + 1];
    }
    out[i] = v;
}
