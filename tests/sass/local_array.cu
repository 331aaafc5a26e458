// A per-thread array written and read at loaded indices: ptxas cannot keep it in registers, so
// its 128 bytes live on the stack in local memory. The fill is 8 STL.128, the indexed write one
// STL and the indexed read one LDL.
extern "C" __global__ void local_array(const int* __restrict__ index, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float table[32];
    for (int k = 0; k < 32; ++k) table[k] = k * 0.5f;
    const int j = index[i];
    table[j & 31] = 1.0f + i;
    out[i] = table[(j >> 5) & 31];
}
