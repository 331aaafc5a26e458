// A scalar kernel: one 32-bit load (LDG.E) and one 32-bit store.
extern "C" __global__ void scalar_load(const float* __restrict__ x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = 2.0f * x[i];
}
