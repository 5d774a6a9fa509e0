// Embedding gather: out[t,:] = table[ids[t],:] as f32.
#include "common.cuh"

template <typename T>
DEV void embed(float* out, const typename Elem<T>::raw* table, const int* ids, int n, int dim, int rows,
               unsigned* fault) {
  pdl_begin();
  int t = blockIdx.x;
  if (t >= n) return;
  int id = ids[t];
  if (id < 0 || id >= rows) {
    if (threadIdx.x == 0) record_fault(fault, FAULT_EMBED_ID, t, id);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) out[(long)t * dim + j] = __uint_as_float(0x7fc00000u);
    return;
  }
  const typename Elem<T>::raw* row = table + (long)id * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) out[(long)t * dim + j] = Elem<T>::load(row, j);
}

extern "C" __global__ void embed_f32(float* out, const float* table, const int* ids, int n, int dim, int rows, unsigned* fault) {
  embed<float>(out, table, ids, n, dim, rows, fault);
}
extern "C" __global__ void embed_bf16(float* out, const uint16_t* table, const int* ids, int n, int dim, int rows, unsigned* fault) {
  embed<BF16>(out, table, ids, n, dim, rows, fault);
}
extern "C" __global__ void embed_f16(float* out, const uint16_t* table, const int* ids, int n, int dim, int rows, unsigned* fault) {
  embed<F16>(out, table, ids, n, dim, rows, fault);
}
