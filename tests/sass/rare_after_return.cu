// The other form of a rare branch: the ordinary case returns, the rest of the scope is rare. Its
// reload and its own store are left out: one load, one store, 1 round, where reading the branch
// as ordinary code gives two of each and 2 rounds.
#define CEK_RARE_PATH()

extern "C" __global__ void rare_after_return(const float* __restrict__ x, float* out, float big) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    if (v <= big) {
        out[i] = v;
        return;
    }
    CEK_RARE_PATH();
    out[i] = v * x[i + 1];
}
