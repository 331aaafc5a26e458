// A warp sum by butterfly: five shuffles (offsets 16, 8, 4, 2, 1), no barrier.
extern "C" __global__ void warp_sum(const float* __restrict__ x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    out[i] = v;
}
