// Two dependent loads: the address of the second is the value of the first (2 rounds).
extern "C" __global__ void pointer_chase(const int* __restrict__ next, const float* __restrict__ x,
                                         float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = x[next[i]];
}
