// A rare branch marked as the kernels mark one (CEK_RARE_PATH(), kernels/cek_chunk.cuh: nothing in
// the code, a mark in the source), which loads again after using the first load: the walk leaves
// it out, so 1 round and one LDG.E, where reading the branch as ordinary code gives 2 rounds and
// two loads.
#define CEK_RARE_PATH()

extern "C" __global__ void rare_branch(const float* __restrict__ x, float* out, float big) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    if (v > big) {
        CEK_RARE_PATH();
        v = 2.0f * x[i + 1];
    }
    out[i] = v;
}
