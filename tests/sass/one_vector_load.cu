// One 128-bit load, then its use: every load of the thread is in flight before the first wait.
extern "C" __global__ void one_vector_load(const float4* __restrict__ x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float4 v = x[i];
    out[i] = v.x + v.y + v.z + v.w;
}
